"""Reads a mink lake table with pyiceberg, through mink's SQLite catalog.

Usage: read_lake.py DATA_DIR NAMESPACE TABLE
Prints one JSON object: the row count, the sorted `id` column, the column names and the
snapshot summary's mink.bucket-offsets.
"""

import json
import os
import sys

from pyiceberg.catalog.sql import SqlCatalog


def main() -> None:
    data_dir, namespace, name = sys.argv[1:4]
    lake = os.path.abspath(os.path.join(data_dir, "lake"))
    catalog = SqlCatalog(
        "mink",
        uri=f"sqlite:///{lake}/catalog.db",
        warehouse=f"file://{lake}/warehouse",
    )
    table = catalog.load_table((namespace, name))
    rows = table.scan().to_arrow()
    snapshot = table.current_snapshot()
    print(
        json.dumps(
            {
                "rows": rows.num_rows,
                "ids": sorted(rows["id"].to_pylist()),
                "columns": rows.column_names,
                "bucket_offsets": snapshot.summary["mink.bucket-offsets"] if snapshot else None,
            }
        )
    )


if __name__ == "__main__":
    main()
