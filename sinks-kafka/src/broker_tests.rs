//! What the sink relies on the broker for, each checked against the test
//! broker (`scripts/with-kafka`; feature `kafka-tests`). docs/kafka.md
//! ("Tested against") lists these facts; a broker that breaks one fails
//! here, by name, before any sink test does.

use std::sync::Arc;
use std::time::Duration;

use crate::marker::{self, Marker};
use crate::read::read_committed;
use crate::recovery::lineage_transactions;
use crate::session::record;
use crate::transaction::{describe, end, init_producer_id, Transaction};
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{ClientConfig, Cluster};

fn brokers() -> String {
    std::env::var("KAFKA_TEST_BROKERS").unwrap_or_else(|_| {
        panic!(
            "KAFKA_TEST_BROKERS is not set: run under scripts/with-kafka (./scripts/test-all does)"
        )
    })
}

fn new_cluster() -> Arc<Cluster> {
    Arc::new(Cluster::new(ClientConfig {
        bootstrap: vec![brokers()],
        client_id: "broker-tests".into(),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
    }))
}

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), fastrand_suffix())
}

fn fastrand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64 % 1_000_000_007)
}

async fn topic(cluster: &Cluster, partitions: i32) -> (Arc<str>, Topic) {
    let name = unique("broker-facts");
    let (topic, _) = Topic::describe_or_create(cluster, &name, partitions, 1)
        .await
        .expect("creating a topic");
    (name.into(), topic)
}

async fn values(topic: &str) -> Vec<String> {
    let read = read_committed(&brokers(), topic).await.expect("reading");
    read.messages
        .into_iter()
        .map(|m| String::from_utf8_lossy(&m.value).into_owned())
        .collect()
}

async fn write(tx: &mut Transaction, topic: &Topic, partition: usize, values: &[&str]) {
    let records = values
        .iter()
        .map(|v| record(None, bytes::Bytes::from(v.to_string()), 0))
        .collect();
    tx.send(partition as i32, topic.leaders[partition], records)
        .await
        .expect("producing");
    tx.flush().await.expect("flushing");
}

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_transaction_is_committed_from_its_identity_by_another_client() {
    let cluster = new_cluster();
    let (name, topic) = topic(&cluster, 1).await;
    let id = unique("facts.resume");
    let mut tx = Transaction::begin(cluster.clone(), name.clone(), &id, TIMEOUT)
        .await
        .expect("begin");
    write(&mut tx, &topic, 0, &["a", "b"]).await;
    let identity = tx.identity().clone();
    drop(tx);
    assert_eq!(
        values(&name).await,
        Vec::<String>::new(),
        "invisible before the commit"
    );
    let state = describe(&cluster, &id).await.expect("describe");
    assert_eq!(state.state, "Ongoing");
    assert_eq!(
        (state.producer_id, state.epoch),
        (identity.producer_id, identity.epoch)
    );
    // A client that never produced: only the identity.
    end(&new_cluster(), &identity, true).await.expect("EndTxn");
    assert_eq!(values(&name).await, ["a", "b"]);
    let read = read_committed(&brokers(), &name).await.expect("reading");
    assert!(read.open_partitions.is_empty(), "{read:?}");
}

#[tokio::test]
async fn a_new_epoch_keeps_the_producer_id_and_aborts_the_open_transaction() {
    let cluster = new_cluster();
    let (name, topic) = topic(&cluster, 1).await;
    let id = unique("facts.epoch");
    let mut tx = Transaction::begin(cluster.clone(), name.clone(), &id, TIMEOUT)
        .await
        .expect("begin");
    write(&mut tx, &topic, 0, &["lost"]).await;
    let first = tx.identity().clone();
    let read = read_committed(&brokers(), &name).await.expect("reading");
    assert_eq!(
        read.open_partitions,
        [0],
        "an open transaction holds the LSO back"
    );
    let (producer_id, epoch) = init_producer_id(&cluster, &id, TIMEOUT)
        .await
        .expect("init");
    println!("first {first}, then producer {producer_id} epoch {epoch}");
    assert!(epoch > first.epoch || producer_id != first.producer_id);
    let state = describe(&cluster, &id).await.expect("describe");
    assert_ne!(state.state, "Ongoing", "{state:?}");
    let mut tx = Transaction::begin(cluster.clone(), name.clone(), &id, TIMEOUT)
        .await
        .expect("begin");
    write(&mut tx, &topic, 0, &["kept"]).await;
    let second = tx.identity().clone();
    end(&cluster, &second, true).await.expect("EndTxn");
    assert_eq!(values(&name).await, ["kept"]);
    let read = read_committed(&brokers(), &name).await.expect("reading");
    assert!(read.open_partitions.is_empty(), "{read:?}");
    println!(
        "same producer id kept: {}",
        second.producer_id == first.producer_id
    );
}

#[tokio::test]
async fn offsets_in_a_transaction_show_only_once_it_commits() {
    let cluster = new_cluster();
    let (name, topic) = topic(&cluster, 1).await;
    let id = unique("facts.marker");
    let mut tx = Transaction::begin(cluster.clone(), name.clone(), &id, TIMEOUT)
        .await
        .expect("begin");
    write(&mut tx, &topic, 0, &["x"]).await;
    let identity = tx.identity().clone();
    tx.mark(&id, 7, &Marker::metadata(&identity))
        .await
        .expect("mark");
    let before = marker::read(&cluster, &id, &name, false)
        .await
        .expect("read");
    assert_eq!(before, None, "the marker shows before the commit");
    end(&cluster, &identity, true).await.expect("EndTxn");
    let after = marker::read(&cluster, &id, &name, true)
        .await
        .expect("read");
    assert_eq!(
        after,
        Some(Marker {
            checkpoint: 7,
            producer_id: identity.producer_id,
            epoch: identity.epoch
        })
    );
    // An aborted transaction's marker never shows.
    let mut tx = Transaction::begin(cluster.clone(), name.clone(), &id, TIMEOUT)
        .await
        .expect("begin");
    write(&mut tx, &topic, 0, &["y"]).await;
    let aborted = tx.identity().clone();
    tx.mark(&id, 8, &Marker::metadata(&aborted))
        .await
        .expect("mark");
    end(&cluster, &aborted, false).await.expect("EndTxn abort");
    let after = marker::read(&cluster, &id, &name, true)
        .await
        .expect("read");
    assert_eq!(after.map(|m| m.checkpoint), Some(7));
    assert_eq!(values(&name).await, ["x"]);
}

#[tokio::test]
async fn open_transactions_are_listed_by_every_broker() {
    let cluster = new_cluster();
    let (name, topic) = topic(&cluster, 2).await;
    let prefix = unique("facts-list");
    let ids: Vec<String> = (0..2)
        .map(|s| format!("{prefix}.lineage1.s{s}.t0"))
        .collect();
    for (partition, id) in ids.iter().enumerate() {
        let mut tx = Transaction::begin(cluster.clone(), name.clone(), id, TIMEOUT)
            .await
            .expect("begin");
        write(&mut tx, &topic, partition, &["open"]).await;
    }
    let mut listed = lineage_transactions(&cluster, &prefix, "lineage1")
        .await
        .expect("ListTransactions");
    listed.sort();
    println!("{listed:?}");
    assert_eq!(
        listed,
        ids.iter()
            .map(|id| (id.clone(), "Ongoing".to_string()))
            .collect::<Vec<_>>()
    );
    for id in &ids {
        init_producer_id(&cluster, id, TIMEOUT)
            .await
            .expect("abort");
    }
    let read = read_committed(&brokers(), &name).await.expect("reading");
    assert!(read.open_partitions.is_empty(), "{read:?}");
    assert!(read.messages.is_empty(), "{read:?}");
}
