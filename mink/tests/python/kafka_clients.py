"""Real Kafka clients (kafka-python, confluent-kafka/librdkafka) against mink's Kafka
listener, for mink/tests/integration/kafka.rs.

    kafka_clients.py COMMAND BOOTSTRAP ARGS...

Every command prints one JSON document on its last line (`produce-loop` also prints
`acked N` lines as deliveries are confirmed). Login: MINK_KAFKA_USER and
MINK_KAFKA_PASSWORD, when set, as SASL/PLAIN; over TLS checked against the certificate
authority in MINK_KAFKA_CA, when set.
"""

import json
import os
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
import kafka
from kafka.errors import OffsetOutOfRangeError


def login_kafka_python():
    user = os.environ.get("MINK_KAFKA_USER")
    if not user:
        return {}
    ca = os.environ.get("MINK_KAFKA_CA")
    tls = {"ssl_cafile": ca} if ca else {}
    return {
        "security_protocol": "SASL_SSL" if ca else "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": user,
        "sasl_plain_password": os.environ["MINK_KAFKA_PASSWORD"],
        **tls,
    }


def login_librdkafka():
    user = os.environ.get("MINK_KAFKA_USER")
    if not user:
        return {}
    ca = os.environ.get("MINK_KAFKA_CA")
    tls = {"ssl.ca.location": ca} if ca else {}
    return {
        "security.protocol": "SASL_SSL" if ca else "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": os.environ["MINK_KAFKA_PASSWORD"],
        **tls,
    }


def text(value):
    return None if value is None else value.decode("utf-8", "replace")


def record(partition, offset, key, value, timestamp, headers):
    return {
        "partition": partition,
        "offset": offset,
        "key": text(key),
        "value": text(value),
        "timestamp": timestamp,
        "headers": sorted([k, text(v)] for k, v in (headers or [])),
    }


def read_all_kafka_python(bootstrap, topic):
    """assign + seek_to_beginning, until every partition's end offset."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, **login_kafka_python()
    )
    partitions = [kafka.TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    ends = consumer.end_offsets(partitions)
    records = []
    deadline = time.time() + 30
    while any(consumer.position(p) < ends[p] for p in partitions) and time.time() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            for m in batch:
                records.append(record(m.partition, m.offset, m.key, m.value, m.timestamp, m.headers))
    consumer.close()
    return records, {str(p.partition): ends[p] for p in partitions}


def read_all_librdkafka(bootstrap, topic):
    """The same with confluent-kafka: assign from OFFSET_BEGINNING up to the watermarks."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "read-all",
        "enable.auto.commit": False,
        **login_librdkafka(),
    })
    metadata = consumer.list_topics(topic, timeout=10)
    partitions = sorted(metadata.topics[topic].partitions)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
    records = []
    seen = {p: 0 for p in partitions}
    deadline = time.time() + 30
    while any(seen[p] < ends[p] for p in partitions) and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(m.error())
        records.append(record(m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1], m.headers()))
        seen[m.partition()] = m.offset() + 1
    consumer.close()
    return records, {str(p): ends[p] for p in partitions}


def read_all(bootstrap, topic):
    python_records, python_ends = read_all_kafka_python(bootstrap, topic)
    rd_records, rd_ends = read_all_librdkafka(bootstrap, topic)
    return {
        "kafka_python": python_records,
        "librdkafka": rd_records,
        "ends": python_ends,
        "librdkafka_ends": rd_ends,
    }


def group_consumer(bootstrap, group):
    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        **login_librdkafka(),
    })


def group_share(bootstrap, topic, group, total):
    """Two consumers in one group split the partitions and read `total` records in all,
    committing what they read."""
    total = int(total)
    consumers = [group_consumer(bootstrap, group) for _ in range(2)]
    for consumer in consumers:
        consumer.subscribe([topic])
    seen = [[] for _ in consumers]
    assigned = [set() for _ in consumers]
    deadline = time.time() + 60
    # Both members poll until both hold partitions and every record is read.
    while time.time() < deadline:
        for i, consumer in enumerate(consumers):
            m = consumer.poll(0.2)
            assigned[i] = {p.partition for p in consumer.assignment()}
            if m is None or m.error():
                continue
            seen[i].append([m.partition(), m.offset(), text(m.value())])
            try:
                consumer.commit(message=m, asynchronous=False)
            except KafkaException as error:
                # A commit during a rebalance is refused; the record comes again.
                if error.args[0].code() != KafkaError.REBALANCE_IN_PROGRESS:
                    raise
        # A record read again after a rebalance (its commit refused) counts once.
        distinct = {value for member in seen for (_, _, value) in member}
        if len(distinct) >= total and all(assigned):
            break
    for consumer in consumers:
        consumer.close()
    return {"assigned": [sorted(a) for a in assigned], "seen": seen}


def group_resume(bootstrap, topic, group, expected):
    """One consumer of the group reads from its committed offsets: `expected` records."""
    expected = int(expected)
    consumer = group_consumer(bootstrap, group)
    consumer.subscribe([topic])
    seen = []
    deadline = time.time() + 60
    while len(seen) < expected and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is None or m.error():
            continue
        seen.append([m.partition(), m.offset(), text(m.value())])
    # Nothing more arrives.
    extra = consumer.poll(1.0)
    if extra is not None and not extra.error():
        seen.append([extra.partition(), extra.offset(), text(extra.value())])
    consumer.close()
    return {"seen": seen}


def wake(bootstrap, topic):
    """A consumer waiting at the end of partition 0 (a long fetch.wait.max.ms) is handed a
    record produced meanwhile: the time from the producer's acknowledgement to the
    consumer's receipt."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "wake",
        "fetch.wait.max.ms": 10000,
        "enable.auto.commit": False,
        **login_librdkafka(),
    })
    consumer.assign([TopicPartition(topic, 0, -1)])
    consumer.poll(1.0)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **login_librdkafka()})
    latencies = []
    for i in range(5):
        time.sleep(0.5)
        acked = []
        producer.produce(topic, value=f"wake{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: acked.append(time.time()))
        producer.flush(10)
        deadline = time.time() + 15
        while time.time() < deadline:
            m = consumer.poll(0.1)
            if m is not None and not m.error() and m.value() == f"wake{i}".encode():
                latencies.append((time.time() - acked[0]) * 1000)
                break
    consumer.close()
    return {"latencies_ms": latencies}


def out_of_range(bootstrap, topic):
    """A fetch below log_start: kafka-python with no reset policy raises it."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="none", enable_auto_commit=False,
        **login_kafka_python(),
    )
    partition = kafka.TopicPartition(topic, 0)
    consumer.assign([partition])
    start = consumer.beginning_offsets([partition])[partition]
    consumer.seek(partition, 0)
    try:
        consumer.poll(timeout_ms=5000)
        consumer.poll(timeout_ms=5000)
        outcome = "no error"
    except OffsetOutOfRangeError as error:
        outcome = "OffsetOutOfRangeError"
    consumer.close()
    return {"log_start": start, "outcome": outcome}


def times(bootstrap, topic, *timestamps):
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, **login_kafka_python())
    partition = kafka.TopicPartition(topic, 0)
    answers = []
    for ts in timestamps:
        found = consumer.offsets_for_times({partition: int(ts)})[partition]
        answers.append(None if found is None else found.offset)
    consumer.close()
    return {"offsets": answers}


def produce(bootstrap, topic, records_json):
    """Produces [key, value, headers] records (value null: a tombstone) with confluent-kafka
    and reports each delivery."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **login_librdkafka()})
    results = []

    def delivered(err, msg):
        results.append({"error": None if err is None else err.name(), "offset": msg.offset()})

    for key, value, headers in json.loads(records_json):
        producer.produce(
            topic,
            key=None if key is None else key.encode(),
            value=None if value is None else value.encode(),
            headers=[(k, v.encode()) for k, v in (headers or {}).items()],
            on_delivery=delivered,
        )
        producer.flush(10)
    return {"deliveries": results}


def produce_loop(bootstrap, topic, count, partitions="1"):
    """An idempotent producer writes values 0..count, value i to partition i % partitions;
    prints `acked N` as each is confirmed, and the confirmed values at the end. A server
    may be killed and restarted meanwhile: librdkafka retries until the message timeout."""
    count = int(count)
    partitions = int(partitions)
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 120000,
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 500,
        **login_librdkafka(),
    })
    acked = []
    failed = []

    def delivered(err, msg):
        if err is None:
            acked.append(int(msg.value()))
            print(f"acked {len(acked)}", flush=True)
        else:
            failed.append([int(msg.value()), err.name()])

    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic, value=str(i).encode(), partition=i % partitions, on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        # Paced, so that the server is killed while records are in flight.
        time.sleep(0.002)
    producer.flush(180)
    return {"acked": sorted(acked), "failed": failed}


def bomb(bootstrap, topic):
    """A gzip batch that inflates past the server's bound is refused; the producer's next,
    small record is still written."""
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap, compression_type="gzip", acks="all",
        max_request_size=200 << 20, retries=0, **login_kafka_python(),
    )
    try:
        producer.send(topic, value=b"\0" * (80 << 20), partition=0).get(timeout=60)
        bomb_outcome = "written"
    except Exception as error:  # the error kafka-python raises for CORRUPT_MESSAGE
        bomb_outcome = type(error).__name__
    small = producer.send(topic, value=b"after the bomb", partition=0).get(timeout=30)
    producer.close()
    return {"bomb": bomb_outcome, "small_offset": small.offset}


def login_refused(bootstrap):
    """Metadata with a wrong password fails (librdkafka retries the login until the
    call's timeout)."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "refused",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": os.environ.get("MINK_KAFKA_USER", "nobody"),
        "sasl.password": "wrong",
    })
    try:
        topics = consumer.list_topics(timeout=5).topics
        outcome = f"listed {sorted(topics)}"
    except KafkaException as error:
        outcome = error.args[0].name()
    consumer.close()
    return {"outcome": outcome}


COMMANDS = {
    "read-all": read_all,
    "group-share": group_share,
    "group-resume": group_resume,
    "wake": wake,
    "out-of-range": out_of_range,
    "times": times,
    "produce": produce,
    "produce-loop": produce_loop,
    "bomb": bomb,
    "login-refused": login_refused,
}

if __name__ == "__main__":
    command, bootstrap, *rest = sys.argv[1:]
    print(json.dumps(COMMANDS[command](bootstrap, *rest)), flush=True)
