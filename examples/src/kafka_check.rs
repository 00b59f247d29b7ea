//! The demos' end check when they read Kafka: what the output lacks of the
//! input, counted from the destination itself.
//!
//! Three reads, in this order:
//! 1. the positions the destination holds for the job (its committed
//!    positions of the source's scope, [`job_positions`]);
//! 2. the output, by the demo;
//! 3. the input topic, `read_committed` ([`InputAtPositions::read`]).
//!
//! Every record below the positions was committed with the output before
//! the output was read, so it must be there, once. Records at or past them
//! may be there too, once each, when other instances of the group commit
//! meanwhile; and since the input is read last, everything the output holds
//! came from a record the input read sees.
//!
//! Each demo says how a record shows in its output (a line, a row id, a
//! copied message); [`InputAtPositions::compare`] counts what is lacking and
//! what is there twice or from elsewhere.

use std::collections::HashMap;
use std::hash::Hash;

use anyhow::Context;
use sink_api::{CommittedPositions, Sink};
use sinks_kafka::{read_committed, Brokers, CommittedMessage};

/// The input topic read back, split at the job's positions.
#[derive(Debug)]
pub struct InputAtPositions {
    /// The topic read.
    pub topic: String,
    /// Records below the job's position of their partition: committed
    /// with the output, so the output holds each once.
    pub below: Vec<CommittedMessage>,
    /// The rest: not committed when the positions were read; the output
    /// may hold them, once each.
    pub past: Vec<CommittedMessage>,
}

/// How an output compares with [`InputAtPositions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comparison {
    /// Records below the job's positions.
    pub covered: u64,
    /// Of those, how many the output lacks.
    pub lacking: u64,
    /// Items in the output that are there more than once, or come from no
    /// record of the input.
    pub extra: u64,
}

impl Comparison {
    /// An error naming `output` and what it lacks or holds more than once,
    /// compared `by` what; `Ok` when neither.
    pub fn check(&self, output: &str, input: &str, by: &str) -> anyhow::Result<()> {
        if self.lacking > 0 || self.extra > 0 {
            anyhow::bail!(
                "{output} lacks {} of the {} records of {input} below the job's positions, and \
                 holds {} items more than once or not from them (compared by {by})",
                self.lacking,
                self.covered,
                self.extra
            );
        }
        Ok(())
    }
}

/// The positions `sink` holds for the Kafka source of `topic` and `group`:
/// the first read of the check, before the output.
pub async fn job_positions<S: Sink>(
    sink: &S,
    topic: &str,
    group: &str,
) -> anyhow::Result<CommittedPositions> {
    let scope = sources_kafka::KafkaSource::scope_of(topic, group);
    sink.committed_positions(&scope)
        .await
        .with_context(|| format!("reading the job's positions of {topic}"))
}

impl InputAtPositions {
    /// Reads `topic` back and splits it at `positions` (from
    /// [`job_positions`]): the last read of the check, after the output.
    pub async fn read(
        brokers: &Brokers,
        topic: &str,
        positions: &CommittedPositions,
    ) -> anyhow::Result<InputAtPositions> {
        let position = |partition: i32| {
            let partition = partition.to_string();
            positions
                .iter()
                .find(|(split, _)| split.rsplit_once('/').map(|(_, p)| p) == Some(&partition))
                .map_or(0, |(_, at)| i64::try_from(*at).unwrap_or(i64::MAX))
        };
        let read = read_committed(brokers.clone(), topic)
            .await
            .with_context(|| format!("reading {topic} back"))?;
        let (below, past) = read
            .messages
            .into_iter()
            .partition(|m| m.offset < position(m.partition));
        Ok(InputAtPositions {
            topic: topic.to_string(),
            below,
            past,
        })
    }

    /// Compares `output` with the input: `shows` gives what a record
    /// becomes in the output (none, one or several items), and `output`
    /// every item the output holds, duplicates kept.
    pub fn compare<'a, K, I>(
        &'a self,
        shows: impl Fn(&'a CommittedMessage) -> I,
        output: impl IntoIterator<Item = K>,
    ) -> Comparison
    where
        K: Hash + Eq,
        I: IntoIterator<Item = K>,
    {
        let mut below: HashMap<K, u64> = HashMap::new();
        for item in self.below.iter().flat_map(&shows) {
            *below.entry(item).or_default() += 1;
        }
        let mut past: HashMap<K, u64> = HashMap::new();
        for item in self.past.iter().flat_map(&shows) {
            *past.entry(item).or_default() += 1;
        }
        let take = |counts: &mut HashMap<K, u64>, item: &K| match counts.get_mut(item) {
            Some(count) if *count > 0 => {
                *count -= 1;
                true
            }
            _ => false,
        };
        let mut extra = 0;
        for item in output {
            if !take(&mut below, &item) && !take(&mut past, &item) {
                extra += 1;
            }
        }
        Comparison {
            covered: self.below.len() as u64,
            lacking: below.values().sum(),
            extra,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(partition: i32, offset: i64, value: &str) -> CommittedMessage {
        CommittedMessage {
            partition,
            offset,
            key: None,
            value: Some(value.as_bytes().to_vec()),
            headers: Vec::new(),
            timestamp: 0,
        }
    }

    fn input() -> InputAtPositions {
        InputAtPositions {
            topic: "in".into(),
            below: vec![message(0, 0, "a"), message(0, 1, "a"), message(1, 0, "b")],
            past: vec![message(1, 1, "c")],
        }
    }

    fn value(m: &CommittedMessage) -> Option<&[u8]> {
        Some(m.value_bytes())
    }

    #[test]
    fn every_record_below_the_positions_once_and_records_past_them_once_pass() {
        let input = input();
        let output: Vec<&[u8]> = vec![b"a", b"b", b"a"];
        let all = input.compare(value, output);
        assert_eq!(
            all,
            Comparison {
                covered: 3,
                lacking: 0,
                extra: 0
            }
        );
        assert!(all.check("out", "in", "value").is_ok());
        let with_past: Vec<&[u8]> = vec![b"a", b"c", b"b", b"a"];
        assert_eq!(input.compare(value, with_past).extra, 0);
    }

    #[test]
    fn a_record_lacking_a_duplicate_and_a_stranger_are_each_counted() {
        let input = input();
        let output: Vec<&[u8]> = vec![b"a", b"b", b"b", b"z", b"c", b"c"];
        let compared = input.compare(value, output);
        assert_eq!(
            compared,
            Comparison {
                covered: 3,
                lacking: 1,
                extra: 3
            }
        );
        let error = compared
            .check("out", "in", "value")
            .unwrap_err()
            .to_string();
        assert!(error.contains("lacks 1 of the 3 records of in"), "{error}");
        assert!(error.contains("holds 3 items more than once"), "{error}");
    }
}
