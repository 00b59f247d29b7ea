//! Stop signals for the programs that serve until told to stop
//! (`ingest-service`, `ingest-baseline`): SIGTERM and SIGINT, taken over from
//! the start so that neither kills the process before its drain.

use anyhow::Context;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::warn;

/// SIGTERM and SIGINT. Installed by a program's `main` before it starts
/// serving; [`first`](Self::first) is the future that tells the server to
/// stop.
#[derive(Debug)]
pub struct StopSignals {
    terminate: Signal,
    interrupt: Signal,
}

impl StopSignals {
    /// Takes both signals over. Must be called from within a tokio runtime.
    pub fn install() -> anyhow::Result<StopSignals> {
        Ok(StopSignals {
            terminate: signal(SignalKind::terminate()).context("handling SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("handling SIGINT")?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }

    /// Completes at the first signal; a second one exits the process at
    /// once with status 1 (the drain is cut short).
    pub async fn first(mut self) {
        self.next().await;
        tokio::spawn(async move {
            self.next().await;
            warn!("second stop signal: exiting without draining");
            std::process::exit(1);
        });
    }
}
