//! The sink: connects, checks the server and the table, makes a writer and
//! a committer per subtask, and answers where the destination's data of a
//! source's splits ends (`committed_positions`).

use std::collections::HashSet;
use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sink_api::{CommittedPositions, InitContext, JobStart, Sink, SinkError, VersionedSerializer};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config};
use tracing::info;

use crate::committer::PostgresCommitter;
use crate::connection::{
    check, connect, connect_error, lock_job, parse_reason, quote_ident, ConnectError,
};
use crate::errors::failed;
use crate::format::CommittableFormat;
use crate::gid::{check_job_name, check_lineage};
use crate::positions::{self, Holders, Owner, DEFAULT_HOLD_LIMIT};
use crate::record::{Column, PgRecord};
use crate::recovery::roll_back_lingering;
use crate::redact::redact_connection_string;
use crate::stats::{PostgresStats, Stats};
use crate::writer::{PgCommittable, PgWriterState, PostgresWriter};

/// A two-phase-commit sink into a PostgreSQL table: each checkpoint's rows
/// of each subtask in one transaction, prepared at the barrier and committed
/// with `COMMIT PREPARED` once the checkpoint completed.
///
/// Made by [`PostgresSink::connect`], which checks the server and the table
/// first; given to the job builder.
///
/// ```no_run
/// # use sinks_postgres::{Column, PgRecord, PostgresSink, ToSql, Type};
/// # struct Order { id: i64 }
/// # impl PgRecord for Order {
/// #     fn columns() -> Vec<Column> { vec![Column::new("id", Type::INT8)] }
/// #     fn push_values<'a>(&'a self, out: &mut Vec<&'a (dyn ToSql + Sync)>) { out.push(&self.id) }
/// # }
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = PostgresSink::<Order>::connect("host=127.0.0.1 user=app dbname=shop", "orders", 2).await?;
/// # Ok(()) }
/// ```
pub struct PostgresSink<T> {
    config: Config,
    /// The connection string without its secrets, for `Debug`.
    redacted: Arc<str>,
    copy_sql: Arc<str>,
    types: Arc<[Type]>,
    stats: Arc<Stats>,
    /// The connection holding the job's advisory lock, taken by the last
    /// start (see [`Sink::on_start`]); closed when the sink is dropped.
    job_lock: Mutex<Option<Client>>,
    /// See [`PostgresSink::position_hold_limit`].
    hold_limit: Duration,
    _records: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for PostgresSink<T> {
    /// The connection string without its secrets, and the `COPY` statement.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSink")
            .field("connection", &self.redacted)
            .field("copy", &self.copy_sql)
            .finish_non_exhaustive()
    }
}

impl<T: PgRecord> PostgresSink<T> {
    /// Connects to `connection` (a libpq-style string such as `host=127.0.0.1
    /// port=5432 user=app dbname=shop`, or a `postgresql://` URL), checks that
    /// the server allows prepared transactions (at least `2 × parallelism` is
    /// recommended), that `table` exists with the columns and types of
    /// [`PgRecord::columns`], and creates the commit marker table if needed.
    ///
    /// Called once, before the job is built. Each refusal names what to
    /// change; none shows a secret of `connection` (see
    /// [`redact_connection_string`]).
    pub async fn connect(
        connection: &str,
        table: &str,
        parallelism: usize,
    ) -> Result<Self, ConnectError> {
        let config =
            Config::from_str(connection).map_err(|error| ConnectError::BadConnectionString {
                connection: redact_connection_string(connection),
                reason: parse_reason(&error),
            })?;
        let columns = T::columns();
        let client = connect(&config).await?;
        let qualified = check(&client, table, &columns, parallelism).await?;
        let names: Vec<String> = columns.iter().map(|c| quote_ident(&c.name)).collect();
        let copy_sql = format!(
            "COPY {qualified} ({}) FROM STDIN (FORMAT binary)",
            names.join(", ")
        );
        Ok(PostgresSink {
            config,
            redacted: redact_connection_string(connection).into(),
            copy_sql: copy_sql.into(),
            types: columns.into_iter().map(|Column { ty, .. }| ty).collect(),
            stats: Arc::new(Stats::default()),
            job_lock: Mutex::new(None),
            hold_limit: DEFAULT_HOLD_LIMIT,
            _records: PhantomData,
        })
    }

    /// How long a prepared transaction of a live instance may hold the
    /// step of a split that one of this sink's writers needs before the
    /// writer rolls it back (60 s by default). Called before the sink is
    /// given to the job.
    ///
    /// A live instance commits its prepared transactions within a
    /// checkpoint, so a longer hold means a commit that is stuck (or an
    /// instance cut off from its lock). Within the limit, a writer that
    /// meets a live owner's transaction is superseded at once; transactions
    /// that no live instance can commit are rolled back at once, whatever
    /// the limit. Rolling back is safe: the transaction's positions did not
    /// move, so its records are read again from the destination, and its
    /// own commit is superseded. See the crate's `positions` module. Also
    /// how long a writer waits for another application's prepared
    /// transaction before it fails the checkpoint.
    pub fn position_hold_limit(mut self, limit: Duration) -> Self {
        self.hold_limit = limit;
        self
    }

    /// What the sink's writers and committers did so far.
    pub fn stats(&self) -> PostgresStats {
        self.stats.snapshot()
    }

    /// A reader of [`stats`](Self::stats) that stays usable after the sink
    /// was given to a job.
    pub fn stats_handle(&self) -> impl Fn() -> PostgresStats + Send + Sync + 'static {
        let stats = self.stats.clone();
        move || stats.snapshot()
    }
}

#[async_trait]
impl<T: PgRecord> Sink for PostgresSink<T> {
    type Writer = PostgresWriter<T>;
    type Committer = PostgresCommitter;

    /// Once per start, before any writer: checks that transaction ids can
    /// carry the job's name and lineage, takes the job's advisory lock on a
    /// connection the sink keeps until the next start (refusing a second
    /// live instance of the job), and rolls back the prepared transactions
    /// of this job that the restored checkpoint does not hold (see the
    /// `recovery` module).
    async fn on_start(
        &self,
        start: &JobStart<'_, PgCommittable, PgWriterState>,
    ) -> Result<(), SinkError> {
        self.stats.register(&start.metrics);
        let job = start.job_name;
        check_job_name(job).map_err(|e| SinkError::msg(e).permanent())?;
        check_lineage(start.lineage.as_str()).map_err(|e| SinkError::msg(e).permanent())?;
        // The previous start's lock goes first: its connection is this
        // process's, and would refuse the new one.
        drop(
            self.job_lock
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let client = connect(&self.config).await.map_err(connect_error)?;
        lock_job(&client, job).await.map_err(SinkError::msg)?;
        let kept: HashSet<&str> = start
            .restored_committables
            .iter()
            .map(|committable| committable.gid.as_str())
            .collect();
        let restored = start.restored_checkpoint_id.map_or(0, |id| id.0);
        let rolled_back = roll_back_lingering(&client, job, &kept, restored, &self.stats)
            .await
            .map_err(failed(
                "rolling back prepared transactions left by earlier starts".into(),
            ))?;
        if rolled_back > 0 {
            info!(
                rolled_back,
                restored, "lingering prepared transactions rolled back"
            );
        }
        *self.job_lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(client);
        Ok(())
    }

    /// Opens the subtask's connection; its transactions are named with the
    /// job's lineage and generation (see the `gid` module).
    async fn create_writer(
        &self,
        context: &InitContext,
        _restored_states: Vec<PgWriterState>,
    ) -> Result<PostgresWriter<T>, SinkError> {
        let job = &context.job_name;
        check_job_name(job).map_err(|e| SinkError::msg(e).permanent())?;
        let lineage = context.lineage.as_str();
        check_lineage(lineage).map_err(|e| SinkError::msg(e).permanent())?;
        let client = connect(&self.config).await.map_err(connect_error)?;
        let copy = client
            .prepare(&self.copy_sql)
            .await
            .map_err(failed(format!("preparing {}", self.copy_sql)))?;
        let backend_pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(failed("reading the writer's server process id".into()))?
            .get(0);
        Ok(PostgresWriter {
            client,
            backend_pid,
            copy_sql: self.copy_sql.clone(),
            copy,
            types: self.types.clone(),
            job: job.clone(),
            generation: context.generation.0,
            subtask: context.subtask_index,
            lineage: lineage.to_string(),
            open: None,
            advances: Vec::new(),
            holders: Holders {
                config: self.config.clone(),
                side: None,
                owner: Owner {
                    job: job.clone(),
                    lineage: lineage.to_string(),
                    generation: context.generation.0,
                },
                hold_limit: self.hold_limit,
            },
            own: Default::default(),
            stats: self.stats.clone(),
            _records: PhantomData,
        })
    }

    async fn create_committer(
        &self,
        _context: &InitContext,
    ) -> Result<PostgresCommitter, SinkError> {
        Ok(PostgresCommitter {
            config: self.config.clone(),
            client: None,
            stats: self.stats.clone(),
        })
    }

    /// Committables in format version 2 (with their source positions);
    /// version 1 still reads. See the crate's `format` module.
    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<PgCommittable>> {
        Arc::new(CommittableFormat)
    }

    /// The sink keeps source positions in [`POSITIONS_TABLE`](crate::POSITIONS_TABLE),
    /// moved only in the transaction of the rows read before them.
    fn commits_positions(&self) -> bool {
        true
    }

    /// Reads `scope`'s positions on a connection of its own: a plain
    /// `SELECT` of the committed rows, which never waits for the locks of
    /// prepared transactions. Called by the runtime at every start and by
    /// sources when splits are assigned to them.
    async fn committed_positions(&self, scope: &str) -> Result<CommittedPositions, SinkError> {
        let client = connect(&self.config).await.map_err(connect_error)?;
        positions::committed(&client, scope).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::types::ToSql;

    struct Row(i64);

    impl PgRecord for Row {
        fn columns() -> Vec<Column> {
            vec![Column::new("id", Type::INT8)]
        }
        fn push_values<'a>(&'a self, out: &mut Vec<&'a (dyn ToSql + Sync)>) {
            out.push(&self.0);
        }
    }

    fn assert_no_secret(shown: &str, secrets: &[&str]) {
        for secret in secrets {
            assert!(!shown.contains(secret), "{secret:?} is shown: {shown}");
        }
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_server_but_no_secret() {
        // Nothing listens on port 1: the connection is refused at once.
        for connection in [
            "postgresql://app:Url-S3cret@127.0.0.1:1/shop?password=Param-S3cret&connect_timeout=5",
            "host=127.0.0.1 port=1 user=app password='Kv S3cret' dbname=shop connect_timeout=5",
        ] {
            let error = PostgresSink::<Row>::connect(connection, "t", 1)
                .await
                .expect_err("nothing listens on port 1");
            assert!(matches!(error, ConnectError::Connect { .. }), "{error}");
            for shown in [error.to_string(), format!("{error:?}")] {
                assert_no_secret(&shown, &["S3cret"]);
            }
            let message = error.to_string();
            assert!(
                message.starts_with(
                    "cannot connect to PostgreSQL (host 127.0.0.1 port 1 database shop): \
                     error connecting to server: "
                ),
                "{message}"
            );
        }
    }

    #[tokio::test]
    async fn a_refused_connection_string_is_shown_without_its_secrets() {
        let error = PostgresSink::<Row>::connect(
            "host=127.0.0.1 port=notaport user=app password=Kv-S3cret",
            "t",
            1,
        )
        .await
        .expect_err("the port is not a number");
        let message = error.to_string();
        assert_eq!(
            message,
            "the connection string host=127.0.0.1 port=notaport user=app password=*** is not \
             valid: invalid connection string: invalid value for option `port`"
        );
        assert_no_secret(&format!("{error:?}"), &["S3cret"]);
        // The driver does not know `sslpassword`: refused, and hidden.
        let error = PostgresSink::<Row>::connect(
            "postgresql://app:Url-S3cret@127.0.0.1:1/shop?sslpassword=Ssl-S3cret",
            "t",
            1,
        )
        .await
        .expect_err("sslpassword is unknown to the driver");
        let message = error.to_string();
        assert!(
            message.contains("postgresql://app:***@127.0.0.1:1/shop?sslpassword=***"),
            "{message}"
        );
        assert_no_secret(&format!("{message} {error:?}"), &["S3cret"]);
        // A key without `=`: the driver's reason quotes the next character,
        // here the password's first.
        let error = PostgresSink::<Row>::connect("host=127.0.0.1 password Zecret", "t", 1)
            .await
            .expect_err("a key without a value");
        let shown = format!("{error} {error:?}");
        assert!(
            !shown.contains("`Z`") && !shown.contains("Zecret"),
            "{shown}"
        );
    }

    #[test]
    fn a_committer_shows_its_server_but_no_secret() {
        let committer = PostgresCommitter {
            config: Config::from_str("host=127.0.0.1 port=1 user=app password=Kv-S3cret")
                .expect("a valid connection string"),
            client: None,
            stats: Arc::new(Stats::default()),
        };
        let shown = format!("{committer:?}");
        assert_no_secret(&shown, &["S3cret"]);
        assert!(shown.contains("host 127.0.0.1 port 1"), "{shown}");
    }
}
