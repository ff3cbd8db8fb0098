"""A Kafka producer and a group's offset commits (confluent-kafka) for the power-cut
histories of mink/tests/integration/power_cut.rs. The server may be killed while a command
runs: every command gives up within seconds (TIMEOUT_MS) and reports what was acknowledged.

    power_cut_kafka.py produce BOOTSTRAP TOPIC FIRST COUNT
        produces the values FIRST..FIRST+COUNT to partition 0 (acks=all); prints
        {"acked": [values the broker acknowledged]}
    power_cut_kafka.py commit BOOTSTRAP TOPIC GROUP OFFSET
        commits OFFSET for partition 0 as GROUP (no membership: a simple consumer's
        commit); prints {"committed": OFFSET} once acknowledged, exits 1 when refused
    power_cut_kafka.py committed BOOTSTRAP TOPIC GROUP
        prints {"committed": the group's committed offset of partition 0, or null}
"""

import json
import sys

from confluent_kafka import Consumer, Producer, TopicPartition

# How long a command waits for the broker before it gives up: long enough for a loaded
# machine, short enough for a killed server's calls to end soon.
TIMEOUT_MS = 10000


def produce(bootstrap, topic, first, count):
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "message.timeout.ms": TIMEOUT_MS,
        "socket.timeout.ms": TIMEOUT_MS,
    })
    acked = []

    def delivered(err, msg):
        if err is None:
            acked.append(int(msg.value()))

    for value in range(int(first), int(first) + int(count)):
        producer.produce(topic, value=str(value).encode(), partition=0, on_delivery=delivered)
    producer.flush(2 * TIMEOUT_MS / 1000)
    return {"acked": sorted(acked)}


def consumer(bootstrap, group):
    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "socket.timeout.ms": TIMEOUT_MS,
    })


def commit(bootstrap, topic, group, offset):
    client = consumer(bootstrap, group)
    try:
        client.commit(offsets=[TopicPartition(topic, 0, int(offset))], asynchronous=False)
    finally:
        client.close()
    return {"committed": int(offset)}


def committed(bootstrap, topic, group):
    client = consumer(bootstrap, group)
    try:
        [partition] = client.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_MS / 1000)
    finally:
        client.close()
    return {"committed": partition.offset if partition.offset >= 0 else None}


def main():
    command, *args = sys.argv[1:]
    commands = {"produce": produce, "commit": commit, "committed": committed}
    print(json.dumps(commands[command](*args)), flush=True)


if __name__ == "__main__":
    main()
