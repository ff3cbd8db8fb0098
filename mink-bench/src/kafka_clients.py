"""The client side of `mink-bench kafka`: confluent-kafka (librdkafka) against mink's
Kafka listener, and ADBC ingest through Flight SQL as the produce baseline.

Usage: python kafka_clients.py BOOTSTRAP FLIGHT_SQL_URI ROWS VALUE_BYTES PINGS

Prints, one a line:
  consume ROWS SECONDS        every row of `bench.stream` read from the beginning
  kcat ROWS SECONDS           the same rows read by kcat (when kcat is installed)
  produce ROWS SECONDS        ROWS records produced into `bench.produced` (acks=all)
  ingest ROWS SECONDS         the same rows by adbc_ingest into `bench.ingested`
  latency MS                  PINGS times: one record produced, until the consumer has it
"""

import shutil
import subprocess
import sys
import time

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap, uri, rows, value_bytes, pings = sys.argv[1:6]
rows, value_bytes, pings = int(rows), int(value_bytes), int(pings)
value = b"x" * value_bytes

# Consume: assign every partition of bench.stream from the beginning.
consumer = Consumer({
    "bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
    "fetch.max.bytes": 32 << 20, "max.partition.fetch.bytes": 8 << 20,
})
partitions = consumer.list_topics("bench.stream", timeout=10).topics["bench.stream"].partitions
consumer.assign([TopicPartition("bench.stream", p, -2) for p in partitions])
start = time.perf_counter()
seen = 0
while seen < rows:
    messages = consumer.consume(10000, 1.0)
    seen += sum(1 for m in messages if not m.error())
print(f"consume {seen} {time.perf_counter() - start}", flush=True)
consumer.close()

# The same read by kcat, librdkafka without Python, when it is installed.
if shutil.which("kcat"):
    start = time.perf_counter()
    subprocess.run(
        ["kcat", "-b", bootstrap, "-C", "-t", "bench.stream", "-o", "beginning", "-e", "-q"],
        stdout=subprocess.DEVNULL, check=True,
    )
    print(f"kcat {rows} {time.perf_counter() - start}", flush=True)

# Produce, acks=all, against adbc_ingest of the same rows.
producer = Producer({
    "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
    "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000,
})
start = time.perf_counter()
for i in range(rows):
    while True:
        try:
            producer.produce("bench.produced", value=value)
            break
        except BufferError:
            producer.poll(0.01)
    if i % 10000 == 0:
        producer.poll(0)
producer.flush(300)
print(f"produce {rows} {time.perf_counter() - start}", flush=True)

table = pa.table({"key": pa.nulls(rows, pa.string()), "value": pa.array([value.decode()] * rows)})
with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cursor:
    start = time.perf_counter()
    # In batches of 50 000 rows: one message of the whole table is over gRPC's bound.
    batches = table.to_reader(max_chunksize=50_000)
    cursor.adbc_ingest("ingested", batches, mode="append", db_schema_name="bench")
    print(f"ingest {rows} {time.perf_counter() - start}", flush=True)

# Latency: a record produced (acks=all) until a consumer waiting at the end has it.
consumer = Consumer({
    "bootstrap.servers": bootstrap, "group.id": "bench-latency", "enable.auto.commit": False,
    "fetch.wait.max.ms": 500, "fetch.min.bytes": 1,
})
consumer.assign([TopicPartition("bench.produced", 0, -1)])
consumer.poll(0.5)
pinger = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
for i in range(pings):
    marker = f"ping{i}".encode()
    sent = time.perf_counter()
    pinger.produce("bench.produced", value=marker, partition=0)
    pinger.flush(10)
    while True:
        m = consumer.poll(1.0)
        if m is not None and not m.error() and m.value() == marker:
            print(f"latency {(time.perf_counter() - sent) * 1e3}", flush=True)
            break
consumer.close()
