"""The client side of `mink-bench log-store`'s write -> visible figure, through ADBC.

Usage: python visible.py PINGS WARMUP URI...

Takes WARMUP + PINGS turns over the Flight SQL endpoints URI...: in turn i, on each node,
`INSERT INTO bench.visible VALUES (i, 'ping-i')`, then `SELECT id, v FROM bench.visible
WHERE id = i` until it returns the row. Prints, for each node in each measured turn,
`NODE INSERT_MS VISIBLE_MS`: the node's index among the URIs, how long the INSERT took (to
its acknowledgement) and how long from before the INSERT to the row, in milliseconds.
"""

import sys
import time

import adbc_driver_flightsql.dbapi as flight_sql

# The longest a row may take to be visible before the figure is given up.
TIMEOUT_S = 10.0

pings, warmup = int(sys.argv[1]), int(sys.argv[2])
uris = sys.argv[3:]
connections = [flight_sql.connect(uri, autocommit=True) for uri in uris]
cursors = [connection.cursor() for connection in connections]
for i in range(warmup + pings):
    for node, cursor in enumerate(cursors):
        start = time.perf_counter()
        cursor.execute(f"INSERT INTO bench.visible VALUES ({i}, 'ping-{i}')")
        cursor.fetchall()
        acked = time.perf_counter()
        while True:
            cursor.execute(f"SELECT id, v FROM bench.visible WHERE id = {i}")
            if cursor.fetch_arrow_table().num_rows == 1:
                break
            if time.perf_counter() - start > TIMEOUT_S:
                sys.exit(f"row {i} not visible at {uris[node]} after {TIMEOUT_S} s")
        visible = time.perf_counter()
        if i >= warmup:
            print(node, (acked - start) * 1e3, (visible - start) * 1e3)
for cursor, connection in zip(cursors, connections):
    cursor.close()
    connection.close()
