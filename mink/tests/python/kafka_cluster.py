"""Kafka clients against the three nodes of a mink cluster, for
mink/tests/integration/kafka_cluster.rs. BOOTSTRAP names every node's Kafka port,
comma-separated.

    kafka_cluster.py group BOOTSTRAP TOPIC GROUP TOTAL
        Two kafka-python consumers of GROUP read TOPIC, committing what they read, until
        they have read the values 0..TOTAL. Prints `coordinator HOST:PORT` once both
        hold partitions (the test then kills that node), and at the end one JSON
        document: the values read (a value read again after a rebalance counts twice)
        and the longest time no record arrived while they read.

    kafka_cluster.py resume BOOTSTRAP TOPIC GROUP EXPECTED
        A consumer of GROUP reads from its committed offsets until it read EXPECTED
        records, and a second more for any beyond: prints the values read.
"""

import json
import sys
import threading
import time

import kafka


def consumer(bootstrap, topic, group):
    return kafka.KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap.split(","),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        metadata_max_age_ms=1000,
        reconnect_backoff_ms=100,
        reconnect_backoff_max_ms=500,
        retry_backoff_ms=100,
    )


def coordinator_address(member):
    """The address of the broker coordinating the member's group, as it knows it."""
    coordinator = member._coordinator.coordinator_id
    if coordinator is None:
        return None
    broker = member._client.cluster.broker_metadata(coordinator)
    return None if broker is None else f"{broker.host}:{broker.port}"


def group(bootstrap, topic, group_id, total):
    total = int(total)
    members = [consumer(bootstrap, topic, group_id) for _ in range(2)]
    lock = threading.Lock()
    values = []
    arrivals = []
    done = threading.Event()
    failures = []

    def read(member):
        try:
            while not done.is_set():
                batches = member.poll(timeout_ms=200)
                now = time.monotonic()
                with lock:
                    for records in batches.values():
                        for record in records:
                            values.append(int(record.value))
                            arrivals.append(now)
                    if set(range(total)) <= set(values):
                        done.set()
                if batches:
                    try:
                        member.commit()
                    except kafka.errors.KafkaError:
                        # Refused during a rebalance or a coordinator move: the records
                        # are read again by whoever holds their partition next.
                        pass
        except Exception as error:  # reported, not swallowed
            failures.append(repr(error))
            done.set()

    threads = [threading.Thread(target=read, args=(m,)) for m in members]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        if all(m.assignment() for m in members):
            address = coordinator_address(members[0])
            if address is not None:
                print(f"coordinator {address}", flush=True)
                break
        time.sleep(0.1)
    done.wait(180)
    done.set()
    for thread in threads:
        thread.join()
    for member in members:
        member.close()
    arrivals.sort()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {
        "values": values,
        "max_gap": max(gaps, default=0.0),
        "failures": failures,
    }


def resume(bootstrap, topic, group_id, expected):
    expected = int(expected)
    member = consumer(bootstrap, topic, group_id)
    values = []
    deadline = time.monotonic() + 60
    while len(values) < expected and time.monotonic() < deadline:
        for records in member.poll(timeout_ms=500).values():
            values.extend(int(record.value) for record in records)
    for records in member.poll(timeout_ms=1000).values():
        values.extend(int(record.value) for record in records)
    member.close()
    return {"values": values}


COMMANDS = {"group": group, "resume": resume}

if __name__ == "__main__":
    command, bootstrap, *rest = sys.argv[1:]
    print(json.dumps(COMMANDS[command](bootstrap, *rest)), flush=True)
