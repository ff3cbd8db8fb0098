"""The client side of `mink bench flight-sql`: the same queries through ADBC.

Usage: python flight_sql_adbc.py URI QUERY_TEMPLATE KEYS QUERIES WARMUP LARGE_SQL

Prints `large ROWS SECONDS` (the large query read batch by batch), then `insert ROWS
EXECUTEMANY_SECONDS INGEST_SECONDS` (KEYS rows written by `cursor.executemany` of an INSERT
with two parameters, then the same rows by `adbc_ingest`, each into a new primary-key
table), then the latency of each one-row query in milliseconds, one a line
(cursor.execute and fetch_arrow_table, after WARMUP uncounted ones).
"""

import sys
import time

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa

uri, template, keys, queries, warmup, large = sys.argv[1:7]
keys, queries, warmup = int(keys), int(queries), int(warmup)

with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cursor:
    latencies = []
    for i in range(warmup + queries):
        start = time.perf_counter()
        cursor.execute(template.replace("{key}", str(i * 7919 % keys)))
        rows = cursor.fetch_arrow_table().num_rows
        elapsed = time.perf_counter() - start
        assert rows == 1, rows
        if i >= warmup:
            latencies.append(elapsed * 1e3)
    start = time.perf_counter()
    cursor.execute(large)
    rows = sum(batch.num_rows for batch in cursor.fetch_record_batch())
    print(f"large {rows} {time.perf_counter() - start}")

    ids = list(range(keys))
    values = [f"inserted-{i}" for i in ids]
    for table in ("bench.executemany", "bench.ingested"):
        cursor.execute(
            f"CREATE TABLE {table} (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id)) "
            "WITH ('bucket.num' = '4')"
        )
    start = time.perf_counter()
    cursor.executemany("INSERT INTO bench.executemany VALUES (?, ?)", list(zip(ids, values)))
    executemany = time.perf_counter() - start
    rows = pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array(values)})
    start = time.perf_counter()
    cursor.adbc_ingest("ingested", rows, mode="append", db_schema_name="bench")
    ingest = time.perf_counter() - start
    for table in ("bench.executemany", "bench.ingested"):
        cursor.execute(f"SELECT count(*) FROM {table}")
        assert cursor.fetchone()[0] == keys, table
    print(f"insert {keys} {executemany} {ingest}")
    for latency in latencies:
        print(latency)
