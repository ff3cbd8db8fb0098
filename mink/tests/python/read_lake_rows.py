"""Reads a mink lake table's rows with pyiceberg, through mink's SQLite catalog.

Usage: read_lake_rows.py DATA_DIR NAMESPACE TABLE
Prints `snapshot ID` (the current snapshot), `columns [...]` (the table's own columns, in
order, without mink's `__` columns), then every row of the current snapshot as a JSON list
of those columns, one per line, sorted by that text. pyiceberg applies the snapshot's
position deletes itself.
"""

import json
import os
import sys

from pyiceberg.catalog import load_catalog


def main() -> None:
    data_dir, namespace, name = sys.argv[1:4]
    lake = os.path.abspath(os.path.join(data_dir, "lake"))
    catalog = load_catalog(
        "mink",
        type="sql",
        uri=f"sqlite:///{lake}/catalog.db",
        warehouse=f"file://{lake}/warehouse",
    )
    table = catalog.load_table((namespace, name))
    snapshot = table.current_snapshot()
    rows = table.scan().to_arrow()
    columns = [c for c in rows.column_names if not c.startswith("__")]
    values = [rows[c].to_pylist() for c in columns]
    lines = sorted(json.dumps(list(row)) for row in zip(*values))
    print(f"snapshot {snapshot.snapshot_id if snapshot else None}")
    print(f"columns {json.dumps(columns)}")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
