"""mink through the ADBC Flight SQL driver, as a Python user reaches it.

Usage: flight_sql_adbc.py URI USER PASSWORD

Runs against a `mink server` that requires USER/PASSWORD and asserts every step: a wrong
password refused, DDL, INSERT, `adbc_ingest` of a million-row Arrow table, a union read
after `CALL system.tier`, UPDATE and DELETE, prepared statements with parameters,
`adbc_get_objects`, `adbc_get_table_schema`, and a result of several hundred MB
streamed batch by batch. Prints one JSON line of figures on success.
"""

import json
import sys
import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa

URI, USER, PASSWORD = sys.argv[1:4]
ROWS = 1_000_000
BIG_ROWS = 3_000_000  # about 330 MB: an 8-byte id and a 100-byte string each


def connect(password):
    return flight_sql.connect(
        URI, db_kwargs={"username": USER, "password": password}, autocommit=True
    )


def one(cursor, sql, parameters=None):
    cursor.execute(sql, parameters)
    return cursor.fetchall()


def main():
    figures = {}

    # A wrong password is refused at the handshake.
    try:
        with connect("not-the-password") as refused, refused.cursor() as cursor:
            cursor.execute("SELECT 1")
        raise AssertionError("a wrong password was accepted")
    except adbc_driver_manager.Error as error:
        assert "Unauthenticated" in str(error) or "UNAUTHENTICATED" in str(error), error

    with connect(PASSWORD) as conn, conn.cursor() as cursor:
        # DDL and INSERT through cursor.execute (the query path).
        one(
            cursor,
            "CREATE TABLE events (id BIGINT NOT NULL, name VARCHAR, amount DOUBLE, "
            "PRIMARY KEY (id)) WITH ('bucket.num' = '4', 'lake.enabled' = 'true')",
        )
        assert one(cursor, "INSERT INTO events VALUES (-1, 'first', 0.5)") == [(1,)]

        # A million rows ingested from Arrow, upserted into the primary-key table.
        table = pa.table(
            {
                "id": pa.array(range(ROWS), pa.int64()),
                "name": pa.array([f"n{i % 1000}" for i in range(ROWS)]),
                "amount": pa.array([i * 0.25 for i in range(ROWS)]),
            }
        )
        # The Go driver sends a batch as one gRPC message of at most 16 MB: chunk it.
        table = pa.Table.from_batches(table.to_batches(max_chunksize=128 * 1024))
        start = time.monotonic()
        assert cursor.adbc_ingest("events", table, mode="append") == ROWS
        figures["ingest_s"] = round(time.monotonic() - start, 2)

        # Tiered into the lake, then changed in the log: the union read sees both.
        tier = one(cursor, "CALL system.tier('events')")
        assert tier[0][1] == ROWS + 1, tier
        assert one(cursor, "UPDATE events SET name = 'updated' WHERE id BETWEEN 0 AND 9") == [(10,)]
        assert one(cursor, "DELETE FROM events WHERE id >= 999990") == [(10,)]
        assert one(cursor, "INSERT INTO events VALUES (2000000, 'late', 1.0)") == [(1,)]
        count, updated, late = one(
            cursor,
            "SELECT count(*), count(*) FILTER (WHERE name = 'updated'), "
            "count(*) FILTER (WHERE id = 2000000) FROM events",
        )[0]
        assert (count, updated, late) == (ROWS + 1 - 10 + 1, 10, 1), (count, updated, late)
        lake = one(cursor, 'SELECT count(*) FROM "events$lake"')[0][0]
        assert lake == ROWS + 1, lake

        # Prepared statements with parameters: a query, and an update run per row.
        assert one(cursor, "SELECT name, amount FROM events WHERE id = ?", (42,)) == [
            ("n42", 10.5)
        ]
        cursor.executemany(
            "INSERT INTO events VALUES (?, ?, ?)",
            [(3000000 + i, f"many{i}", float(i)) for i in range(5)],
        )
        assert one(cursor, "SELECT count(*) FROM events WHERE id >= ?", (3000000,)) == [(5,)]
        # One row of parameters through cursor.execute (the query path): each value is
        # cast to its column's type (an int for a DOUBLE, a None), as executemany does.
        assert one(cursor, "INSERT INTO events VALUES (?, ?, ?)", (3000005, None, 7)) == [(1,)]
        assert one(cursor, "SELECT name, amount FROM events WHERE id = ?", (3000005,)) == [
            (None, 7.0)
        ]

        # Metadata, as ADBC and tools browse it.
        objects = conn.adbc_get_objects(depth="columns", table_name_filter="events")
        catalogs = objects.read_all().to_pylist()
        tables = [
            t
            for c in catalogs
            if c["catalog_name"] == "mink"
            for s in c["catalog_db_schemas"]
            if s["db_schema_name"] == "default"
            for t in s["db_schema_tables"]
        ]
        assert [t["table_name"] for t in tables] == ["events"], catalogs
        columns = [c["column_name"] for c in tables[0]["table_columns"]]
        assert columns == ["id", "name", "amount"], columns
        schema = conn.adbc_get_table_schema("events")
        assert schema.names == ["id", "name", "amount"], schema
        assert schema.field("id").type == pa.int64()

        # Several hundred MB streamed batch by batch, never held whole.
        start = time.monotonic()
        cursor.execute(
            "SELECT value AS id, repeat('x', 100) AS pad "
            f"FROM generate_series(1, {BIG_ROWS})"
        )
        rows = size = 0
        for batch in cursor.fetch_record_batch():
            rows += batch.num_rows
            size += batch.nbytes
        elapsed = time.monotonic() - start
        assert rows == BIG_ROWS, rows
        assert size > 300e6, size
        figures["large_result_mb"] = round(size / 1e6)
        figures["large_result_mb_per_s"] = round(size / 1e6 / elapsed)

    print(json.dumps(figures))


if __name__ == "__main__":
    main()
