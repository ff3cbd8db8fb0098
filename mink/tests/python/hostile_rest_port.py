"""One table read by pyiceberg and DuckDB through mink's Iceberg REST catalog, after the
hostile REST port tests (hostile_lake_commits.rs): the catalog holds a thousand
namespaces by then, so only the named table is read.

Usage: hostile_rest_port.py URI USER PASSWORD read NAMESPACE TABLE
"""

import json
import sys

from iceberg_rest import catalog, duckdb_connection


def read(uri: str, user: str, password: str, namespace: str, table: str) -> dict:
    loaded = catalog(uri, user, password).load_table((namespace, table))
    con = duckdb_connection(uri, user, password)
    duck = con.execute(f'SELECT id FROM lake."{namespace}"."{table}" ORDER BY id')
    return {
        "pyiceberg": sorted(loaded.scan().to_arrow()["id"].to_pylist()),
        "duckdb": [row[0] for row in duck.fetchall()],
    }


def main() -> None:
    uri, user, password, step, *args = sys.argv[1:]
    steps = {"read": read}
    print(json.dumps(steps[step](uri, user, password, *args)))


if __name__ == "__main__":
    main()
