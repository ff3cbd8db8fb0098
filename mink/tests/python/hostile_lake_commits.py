"""Forged commits to a mink log table through its Iceberg REST catalog, and a pyiceberg append.

Usage: hostile_lake_commits.py URI USER PASSWORD STEP NS TABLE [ARGS]

Steps (each prints one JSON object):
- forge NS TABLE: sends commits a client controls, each valid but for one field later commits
  depend on, as raw HTTP: {"answers": {name: [status, type, message]}, "snapshot": id}
  (the table's current snapshot afterwards).
- append NS TABLE FIRST COUNT [COLUMN VALUE]: appends rows FIRST..FIRST+COUNT through
  pyiceberg (as iceberg_rest.py does; with COLUMN set to VALUE in each, a partition key),
  then counts the table's rows as pyiceberg reads them: {"snapshot": id, "rows": n}.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from iceberg_rest import append as pyiceberg_append  # noqa: E402
from iceberg_rest import bearer_token, catalog, rows_for  # noqa: E402


def call(uri: str, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        uri + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def answer_of(status: int, body: dict) -> list:
    error = body.get("error") or {}
    return [status, error.get("type"), error.get("message")]


def forge(uri: str, user: str, password: str, namespace: str, name: str) -> dict:
    token = bearer_token(uri, user, password)
    path = f"/v1/namespaces/{namespace}/tables/{name}"
    status, loaded = call(uri, "GET", path, token)
    assert status == 200, loaded
    metadata = loaded["metadata"]
    current_id = metadata["current-snapshot-id"]
    current = next(s for s in metadata["snapshots"] if s["snapshot-id"] == current_id)
    now = int(time.time() * 1000)

    def snapshot(**fields) -> dict:
        """A snapshot on the current one, valid but for `fields` (it reuses the current
        manifest list, which is refused last of all)."""
        return {
            "snapshot-id": 4_000_000_000_000 + len(fields),
            "parent-snapshot-id": current_id,
            "sequence-number": metadata["last-sequence-number"] + 1,
            "timestamp-ms": max(now, current["timestamp-ms"]),
            "manifest-list": current["manifest-list"],
            "summary": {"operation": "append"},
            "schema-id": metadata["current-schema-id"],
            **fields,
        }

    def commit(*updates, snap: dict | None = None) -> list:
        if snap is not None:
            updates = (
                {"action": "add-snapshot", "snapshot": snap},
                {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
                 "snapshot-id": snap["snapshot-id"]},
            )
        body = {
            "requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": current_id}],
            "updates": list(updates),
        }
        return answer_of(*call(uri, "POST", path, token, body))

    year_2100 = 4_102_444_800_000
    answers = {
        "year 2100": commit(snap=snapshot(**{"timestamp-ms": year_2100})),
        "before the parent": commit(snap=snapshot(**{"timestamp-ms": current["timestamp-ms"] - 3_600_000})),
        "sequence number 2^63-1": commit(snap=snapshot(**{"sequence-number": 2**63 - 1})),
        "sequence number reused": commit(snap=snapshot(**{"sequence-number": metadata["last-sequence-number"]})),
        "unknown schema": commit(snap=snapshot(**{"schema-id": 99})),
        "stale parent": commit(snap=snapshot(**{"parent-snapshot-id": current.get("parent-snapshot-id", 1)})),
        "snapshot id taken": commit(snap=snapshot(**{"snapshot-id": current_id})),
        "manifest list reused": commit(snap=snapshot()),
        "set-current-schema": commit({"action": "set-current-schema", "schema-id": 99}),
        "remove-snapshots": commit({"action": "remove-snapshots", "snapshot-ids": [current_id]}),
        "set-properties": commit({"action": "set-properties", "updates": {"history.expire.max-snapshot-age-ms": "1"}}),
        "assign-uuid": commit({"action": "assign-uuid", "uuid": "00000000-0000-0000-0000-000000000001"}),
        "upgrade-format-version": commit({"action": "upgrade-format-version", "format-version": 3}),
        "set-location": commit({"action": "set-location", "location": "/tmp/elsewhere"}),
    }
    status, loaded = call(uri, "GET", path, token)
    assert status == 200, loaded
    return {"answers": answers, "snapshot": loaded["metadata"]["current-snapshot-id"]}


def append(uri: str, user: str, password: str, namespace: str, name: str, first: str, count: str,
           *column_value: str) -> dict:
    if column_value:
        column, value = column_value
        table = catalog(uri, user, password).load_table((namespace, name))
        rows = rows_for(table, int(first), int(count))
        index = rows.schema.get_field_index(column)
        rows = rows.set_column(index, rows.schema.field(index), pa.array([value] * rows.num_rows, type=rows.schema.field(index).type))
        table.append(rows)
    else:
        pyiceberg_append(uri, user, password, namespace, name, first, count)
    table = catalog(uri, user, password).load_table((namespace, name))
    return {"snapshot": table.current_snapshot().snapshot_id, "rows": table.scan().to_arrow().num_rows}


def main() -> None:
    uri, user, password, step, *args = sys.argv[1:]
    steps = {"forge": forge, "append": append}
    print(json.dumps(steps[step](uri, user, password, *args)))


if __name__ == "__main__":
    main()
