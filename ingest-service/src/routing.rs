//! Which instance of the ingest service owns an idempotency key, when
//! several run side by side: rendezvous hashing of the key over the
//! instance ids.
//!
//! A key's retries must reach the instance that remembers it: keys live in
//! that instance's checkpoints only. Every instance knows the whole set of
//! ids (`--instances a,b,c`) and its own (`--instance-id b`); a keyed
//! request whose key another instance owns is refused with `421
//! Misdirected Request` and the owner's id in the `Ingest-Owner` header,
//! before anything of it is taken. Requests without a key go to any
//! instance.
//!
//! ```text
//!  owner(key) = the id with the largest SipHash-1-3(keys 0, 0) of  id ‖ 0xff ‖ key
//! ```
//!
//! The rule is deterministic and small enough for a router to apply (a
//! load balancer's script, a sidecar, or the client itself, as
//! `ingest-client` does), and it moves few keys when the set changes: a
//! removed id's keys spread over the others, an added id takes about a
//! share of everyone's. A key that moves loses what its old owner knew of
//! it (see `docs/scale-out.md`): change the set only after the keys'
//! retention has passed with the old set draining, or accept that a retry
//! across the change may store its events twice.

use siphasher::sip::SipHasher13;
use std::hash::Hasher;

/// The response header naming a key's owner on a 421.
pub const OWNER_HEADER: &str = "ingest-owner";

/// The largest instance id: 1 to 64 of `a-z`, `0-9`, `-` and `_`.
pub const MAX_ID_LEN: usize = 64;

/// An instance's id and the ids of the whole set (its own among them).
/// Made by [`Instances::new`]; read by the service for each keyed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instances {
    me: String,
    all: Vec<String>,
}

impl Instances {
    /// `me` among `all`: every id plain (see [`parse_instance_id`]), none
    /// twice, `me` one of them.
    pub fn new(me: &str, all: &[String]) -> Result<Instances, String> {
        let me = parse_instance_id(me)?;
        let mut sorted = Vec::with_capacity(all.len());
        for id in all {
            sorted.push(parse_instance_id(id)?);
        }
        sorted.sort();
        if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("the instance id '{}' is listed twice", twice[0]));
        }
        if !sorted.contains(&me) {
            return Err(format!(
                "this instance's id '{me}' is not among the instances ({})",
                sorted.join(",")
            ));
        }
        Ok(Instances { me, all: sorted })
    }

    /// A single instance: it owns every key.
    pub fn alone(me: &str) -> Result<Instances, String> {
        Instances::new(me, &[me.to_string()])
    }

    /// This instance's id.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Every id, sorted.
    pub fn all(&self) -> &[String] {
        &self.all
    }

    /// The owner of `key`, if it is another instance.
    pub fn other_owner(&self, key: &str) -> Option<&str> {
        let owner = owner(key, &self.all)?;
        (owner != self.me).then_some(owner)
    }
}

/// The owner of `key` among `ids` by rendezvous hashing; `None` when `ids`
/// is empty.
pub fn owner<'a>(key: &str, ids: &'a [String]) -> Option<&'a str> {
    ids.iter()
        .map(|id| (weight(id, key), id))
        .max()
        .map(|(_, id)| id.as_str())
}

fn weight(id: &str, key: &str) -> u64 {
    let mut hasher = SipHasher13::new_with_keys(0, 0);
    hasher.write(id.as_bytes());
    hasher.write_u8(0xff);
    hasher.write(key.as_bytes());
    hasher.finish()
}

/// Accepts an instance id: 1 to [`MAX_ID_LEN`] of `a-z`, `0-9`, `-` and
/// `_`, so that it can name a prefix of the shared storage and a job.
pub fn parse_instance_id(text: &str) -> Result<String, String> {
    let plain = !text.is_empty()
        && text.len() <= MAX_ID_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if plain {
        Ok(text.to_string())
    } else {
        Err(format!(
            "'{text}' is not an instance id: use 1 to {MAX_ID_LEN} of a-z, 0-9, - and _"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_instance_agrees_on_the_owner_of_a_key() {
        let all = ids(&["a", "b", "c"]);
        for n in 0..1000 {
            let key = format!("key-{n}");
            let owner = owner(&key, &all).unwrap();
            for me in ["a", "b", "c"] {
                let instances = Instances::new(me, &all).unwrap();
                let expected = (me != owner).then_some(owner);
                assert_eq!(
                    instances.other_owner(&key),
                    expected,
                    "{key} seen from {me}"
                );
            }
        }
    }

    #[test]
    fn keys_spread_over_the_instances_and_few_move_when_one_is_added() {
        let three = ids(&["a", "b", "c"]);
        let four = ids(&["a", "b", "c", "d"]);
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        let mut moved = 0;
        for n in 0..30_000 {
            let key = format!("client-{n}");
            let before = owner(&key, &three).unwrap();
            *counts.entry(before).or_default() += 1;
            let after = owner(&key, &four).unwrap();
            if after != before {
                assert_eq!(after, "d", "a key moved between old instances");
                moved += 1;
            }
        }
        for (id, count) in &counts {
            assert!((9_000..11_000).contains(count), "{id}: {count} of 30 000");
        }
        assert!((6_500..8_500).contains(&moved), "{moved} of 30 000 moved");
    }

    #[test]
    fn the_rule_is_fixed() {
        // A router implemented elsewhere must agree: these owners are part
        // of the contract and change only with a documented migration.
        // (CPython's hash of bytes is SipHash-1-3 too, with zero keys under
        // PYTHONHASHSEED=0, and gives the same owners.)
        let all = ids(&["a", "b", "c"]);
        let owners: Vec<&str> = ["k1", "k2", "k3", "k4", "k5", "k6"]
            .iter()
            .map(|key| owner(key, &all).unwrap())
            .collect();
        assert_eq!(owners, FIXED_OWNERS);
    }

    const FIXED_OWNERS: [&str; 6] = ["a", "a", "b", "c", "b", "a"];

    #[test]
    fn bad_sets_and_ids_are_refused() {
        assert!(Instances::new("a", &ids(&["a", "a"])).is_err());
        assert!(Instances::new("x", &ids(&["a", "b"])).is_err());
        for bad in ["", "A", "a b", "a/b", &"x".repeat(65)] {
            assert!(parse_instance_id(bad).is_err(), "{bad} accepted");
        }
        assert!(Instances::alone("solo").unwrap().other_owner("k").is_none());
    }
}
