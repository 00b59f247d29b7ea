"""An independent Kafka client for the tests: librdkafka, through the
confluent-kafka package (scripts/with-librdkafka installs it).

    librdkafka_client.py produce BROKERS TOPIC CODEC FIRST END PARTITIONS
        writes the values v<id> keyed by <id> for ids FIRST..END into TOPIC
        (created with PARTITIONS partitions if missing), compressed with
        CODEC, partitioned as Java's client does (murmur2_random)
    librdkafka_client.py produce-shaped BROKERS TOPIC FIRST END PARTITIONS
        writes records of every shape for ids FIRST..END, keyed k<id % 50>:
        null values (tombstones), empty values and v<id>; a header
        trace=t<id>, an empty header or a null one; timestamps a second
        apart over the last hour (zstd, Java's partitioner)
    librdkafka_client.py consume BROKERS TOPIC [--full]
        prints one JSON object: every committed record of TOPIC
        (read_committed), as [partition, key, value] (null kept as null);
        with --full also its headers ([[name, value or null], ...]) and
        its timestamp
    librdkafka_client.py commit BROKERS GROUP TOPIC
        joins GROUP as a consumer of TOPIC, reads what it is dealt, commits
        its offsets, leaves; prints the partitions and offsets committed
    librdkafka_client.py member BROKERS GROUP TOPIC SECONDS
        stays a member of GROUP for SECONDS, reading what it is dealt and
        committing its offsets every 100 records; prints what it read
"""
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def produce(brokers, topic, codec, first, end, partitions):
    create_topic(brokers, topic, partitions)
    producer = producer_of(brokers, codec)
    errors = []
    for i in range(int(first), int(end)):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(),
                         on_delivery=lambda err, _msg: err and errors.append(str(err)))
        producer.poll(0)
    flushed(producer, errors, int(end) - int(first))


def create_topic(brokers, topic, partitions):
    admin = AdminClient({"bootstrap.servers": brokers})
    futures = admin.create_topics([NewTopic(topic, num_partitions=int(partitions), replication_factor=1)])
    for future in futures.values():
        try:
            future.result()
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise


def producer_of(brokers, codec):
    return Producer({
        "bootstrap.servers": brokers,
        "compression.type": codec,
        "enable.idempotence": True,
        "linger.ms": 20,
        "partitioner": "murmur2_random",
    })


def flushed(producer, errors, written):
    left = producer.flush(60)
    if left or errors:
        sys.exit(f"librdkafka: {left} undelivered, errors: {errors[:3]}")
    print(json.dumps({"written": written}))


def produce_shaped(brokers, topic, first, end, partitions):
    create_topic(brokers, topic, partitions)
    producer = producer_of(brokers, "zstd")
    errors = []
    now = int(time.time() * 1000)
    first, end = int(first), int(end)
    for i in range(first, end):
        value = [None, b"", f"v{i}".encode()][i % 3]
        headers = [("trace", f"t{i}".encode())]
        headers += [[("empty", b"")], [("null", None)], []][i % 3]
        producer.produce(topic, key=f"k{i % 50}".encode(), value=value, headers=headers,
                         timestamp=now - 3_600_000 + (i - first) * 1000,
                         on_delivery=lambda err, _msg: err and errors.append(str(err)))
        producer.poll(0)
    flushed(producer, errors, end - first)


def consume(brokers, topic, full=None):
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": f"librdkafka-check-{time.time_ns()}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    metadata = consumer.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    ends = {}
    assignment = []
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        ends[p] = high
        if high > low:
            assignment.append(TopicPartition(topic, p, low))
    consumer.assign(assignment)
    records = []
    done = {tp.partition for tp in assignment}
    deadline = time.time() + 120
    while done and time.time() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            # read_committed stops at the last stable offset; past control
            # records there is nothing more to hand out.
            for p in list(done):
                position = consumer.position([TopicPartition(topic, p)])[0].offset
                if position >= ends[p] or position < 0 and not assignment:
                    done.discard(p)
            continue
        if message.error():
            if message.error().code() == -191:  # _PARTITION_EOF
                done.discard(message.partition())
                continue
            sys.exit(f"librdkafka: {message.error()}")
        key = message.key().decode() if message.key() is not None else None
        value = message.value().decode() if message.value() is not None else None
        record = [message.partition(), key, value]
        if full == "--full":
            headers = [[name, None if v is None else v.decode()]
                       for name, v in message.headers() or []]
            record += [headers, message.timestamp()[1]]
        records.append(record)
        if message.offset() + 1 >= ends[message.partition()]:
            done.discard(message.partition())
    consumer.close()
    print(json.dumps({"records": records}))


def group_member(brokers, group, topic):
    """A consumer of TOPIC in GROUP, committing by hand, from the start."""
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
    })
    consumer.subscribe([topic])
    return consumer


def commit(brokers, group, topic):
    consumer = group_member(brokers, group, topic)
    read = 0
    deadline = time.time() + 60
    while time.time() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            if read:
                break
            continue
        if message.error():
            continue
        read += 1
        if read >= 500:
            break
    committed = consumer.commit(asynchronous=False) if read else []
    consumer.close()
    print(json.dumps({
        "read": read,
        "committed": [[tp.partition, tp.offset] for tp in committed or []],
    }))


def member(brokers, group, topic, seconds):
    consumer = group_member(brokers, group, topic)
    read = 0
    deadline = time.time() + float(seconds)
    while time.time() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        read += 1
        if read % 100 == 0:
            try:
                consumer.commit(asynchronous=False)
            except KafkaException:
                pass
    consumer.close()
    print(json.dumps({"read": read}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"produce": produce, "produce-shaped": produce_shaped, "consume": consume,
     "commit": commit, "member": member}[command](*args)
