"""Primary keys too long for mink's KV store, written through the Flight SQL endpoint.

Usage: long_keys.py URI TABLE LONG FITS

Creates TABLE (`k VARCHAR NOT NULL, v BIGINT, PRIMARY KEY (k)`, one bucket), then tries
a key of LONG characters through an INSERT and through `adbc_ingest` (bulk ingest): each
must fail and name the limit (MAX_KEY_BYTES). A key of FITS characters, the longest that
fits, is inserted (v = 1) and updated (v = 2). Prints one JSON line: the two errors.
"""

import json
import sys

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa

URI, TABLE = sys.argv[1:3]
LONG, FITS = (int(n) for n in sys.argv[3:5])


def refused(attempt):
    """The error of `attempt`, which must fail and name the key bound."""
    try:
        attempt()
    except adbc_driver_manager.Error as error:
        message = str(error)
        assert "MAX_KEY_BYTES" in message, message
        return message
    raise AssertionError("a key too long for the KV store was accepted")


def main():
    with flight_sql.connect(URI, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {TABLE} (k VARCHAR NOT NULL, v BIGINT, PRIMARY KEY (k)) "
            "WITH ('bucket.num' = '1')"
        )
        cursor.fetchall()
        insert = refused(
            lambda: cursor.execute(f"INSERT INTO {TABLE} VALUES (repeat('x', {LONG}), 1)")
        )
        rows = pa.table(
            {
                "k": pa.array(["short", "x" * LONG], pa.string()),
                "v": pa.array([1, 2], pa.int64()),
            }
        )
        ingest = refused(lambda: cursor.adbc_ingest(TABLE, rows, mode="append"))
        cursor.execute(f"INSERT INTO {TABLE} VALUES (repeat('y', {FITS}), 1)")
        assert cursor.fetchall() == [(1,)]
        cursor.execute(f"UPDATE {TABLE} SET v = 2 WHERE k = repeat('y', {FITS})")
        assert cursor.fetchall() == [(1,)]
    print(json.dumps({"insert": insert, "ingest": ingest}))


if __name__ == "__main__":
    main()
