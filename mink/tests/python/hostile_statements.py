"""Runs statements over Flight SQL with the ADBC driver: one statement per line of
stdin (statements too long for a command line), those written `PREPARE:<sql>` as prepared
statements, and `SELECT 1` after each. Prints one
line per statement: `ok|error <TAB> the answer to SELECT 1 <TAB> the first value of
the answer, or the error's message`."""

import sys

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager

with flight_sql.connect(sys.argv[1], autocommit=True) as conn:
    for line in sys.stdin:
        sql = line.rstrip("\n")
        with conn.cursor() as cursor:
            try:
                if sql.startswith("PREPARE:"):
                    sql = sql[len("PREPARE:"):]
                    cursor.adbc_prepare(sql)
                cursor.execute(sql)
                rows = cursor.fetchall()
                outcome, message = "ok", str(rows[0][0]) if rows else ""
            except adbc_driver_manager.Error as error:
                outcome, message = "error", str(error).replace("\n", " ")[:1000]
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            after = cursor.fetchall()[0][0]
        print(f"{outcome}\t{after}\t{message}", flush=True)
