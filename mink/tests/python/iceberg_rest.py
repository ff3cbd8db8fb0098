"""Reads and appends to mink's lake through its Iceberg REST catalog, as other engines do.

Usage: iceberg_rest.py URI USER PASSWORD STEP [ARGS]

With MINK_TEST_CA set, both engines trust that certificate authority (an https:// URI).

Steps (each prints one JSON object):
- read: every table of every namespace, through pyiceberg's RestCatalog and DuckDB's
  iceberg extension: {"namespaces": [...], "tables": {"ns.t": {"snapshot": id,
  "pyiceberg": [sorted ids], "duckdb": [sorted ids]}}}.
- append NS TABLE FIRST COUNT: appends rows FIRST..FIRST+COUNT of a log table through
  pyiceberg: {"snapshot": id}.
- refused NS TABLE: tries to append to a primary-key table: {"error": "..."}.
- hostile: requests a client controls, badly formed: {"answers": {name: [status, type]}}.
- guest: pyiceberg creates a namespace and a table of its own, appends to it twice, reads
  it, tries what a hosted table refuses, then purges the table and drops the namespace:
  {"ids": [...], "snapshots": n, "location": "...", "answers": {name: [status, type]},
  "namespaces": [...] afterwards}.
"""

import glob
import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog


# The certificate authority of an https:// catalog whose certificate a private one signed.
CA = os.environ.get("MINK_TEST_CA")
if CA:
    # requests prefers these to a session's own bundle: point them at it too.
    os.environ["REQUESTS_CA_BUNDLE"] = os.environ["CURL_CA_BUNDLE"] = CA


def catalog(uri: str, user: str, password: str) -> RestCatalog:
    tls = {"ssl": {"cabundle": CA}} if CA else {}
    return RestCatalog("mink", uri=uri, credential=f"{user}:{password}", **tls)


def duckdb_connection(uri: str, user: str, password: str):
    import duckdb

    con = duckdb.connect()
    # DuckDB cannot download extensions here: load the files of the pip packages.
    site = os.path.dirname(os.path.dirname(duckdb.__file__))
    for name in ("avro", "httpfs", "iceberg"):
        (path,) = glob.glob(f"{site}/duckdb_extension_{name}/extensions/*/{name}.duckdb_extension")
        con.execute(f"LOAD '{path}'")
    if CA:
        con.execute(f"SET ca_cert_file = '{CA}'")
    con.execute(
        f"CREATE SECRET rest (TYPE iceberg, CLIENT_ID '{user}', CLIENT_SECRET '{password}', "
        f"OAUTH2_SERVER_URI '{uri}/v1/oauth/tokens')"
    )
    con.execute(f"ATTACH 'mink' AS lake (TYPE iceberg, ENDPOINT '{uri}', SECRET rest)")
    return con


def read(uri: str, user: str, password: str) -> dict:
    rest = catalog(uri, user, password)
    con = duckdb_connection(uri, user, password)
    namespaces = [ns[0] for ns in rest.list_namespaces()]
    tables = {}
    for namespace in namespaces:
        for identifier in rest.list_tables(namespace):
            name = ".".join(identifier)
            table = rest.load_table(identifier)
            snapshot = table.current_snapshot()
            ids = sorted(table.scan().to_arrow()["id"].to_pylist())
            duck = con.execute(f'SELECT id FROM lake."{identifier[0]}"."{identifier[1]}" ORDER BY id')
            tables[name] = {
                "snapshot": snapshot.snapshot_id if snapshot else None,
                "pyiceberg": ids,
                "duckdb": [row[0] for row in duck.fetchall()],
            }
    return {"namespaces": namespaces, "tables": tables}


def rows_for(table, first: int, count: int) -> pa.Table:
    schema = table.schema().as_arrow()
    rows = [
        {
            "id": i,
            "name": f"foreign-{i}",
            "__bucket": 0,
            "__offset": -1,
            "__timestamp": 0,
        }
        for i in range(first, first + count)
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def append(uri: str, user: str, password: str, namespace: str, name: str, first: str, count: str) -> dict:
    table = catalog(uri, user, password).load_table((namespace, name))
    table.append(rows_for(table, int(first), int(count)))
    return {"snapshot": table.current_snapshot().snapshot_id}


def refused(uri: str, user: str, password: str, namespace: str, name: str) -> dict:
    table = catalog(uri, user, password).load_table((namespace, name))
    schema = table.schema().as_arrow()
    row = {field.name: None for field in schema}
    row.update({"dt": "2024-01-01", "id": 1, "seq": 0, "__bucket": 0, "__offset": -1, "__timestamp": 0})
    try:
        table.append(pa.Table.from_pylist([row], schema=schema))
    except Exception as error:  # pyiceberg raises ForbiddenError
        return {"error": f"{type(error).__name__}: {error}"}
    return {"error": None}


def request(uri: str, method: str, path: str, body: bytes | None = None, token: str | None = None,
            content_type: str = "application/json") -> list:
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    call = urllib.request.Request(uri + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:
            return [answer.status, None]
    except urllib.error.HTTPError as error:
        text = error.read()
        try:
            kind = json.loads(text)["error"]
            kind = kind["type"] if isinstance(kind, dict) else kind
        except Exception:
            kind = text.decode(errors="replace")[:80]
        return [error.code, kind]


def huge_body(uri: str, path: str, token: str) -> list:
    """Announces a 4 MiB commit and sends its first bytes only: the server answers from the
    length alone (sending it all would race the server closing the connection)."""
    host = urllib.parse.urlsplit(uri).netloc
    connection = http.client.HTTPConnection(host, timeout=30)
    connection.putrequest("POST", path)
    connection.putheader("Authorization", f"Bearer {token}")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(4 << 20))
    connection.endheaders()
    connection.send(b"[0,")
    answer = connection.getresponse()
    return [answer.status, json.loads(answer.read())["error"]["type"]]


def bearer_token(uri: str, user: str, password: str) -> str:
    return json.loads(
        urllib.request.urlopen(
            urllib.request.Request(
                uri + "/v1/oauth/tokens",
                data=f"grant_type=client_credentials&client_id={user}&client_secret={password}".encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ),
            timeout=30,
        ).read()
    )["access_token"]


def hostile(uri: str, user: str, password: str) -> dict:
    token = bearer_token(uri, user, password)
    form = "application/x-www-form-urlencoded"
    table = "/v1/namespaces/test/tables/restlog"
    current = catalog(uri, user, password).load_table(("test", "restlog")).metadata
    outside = {
        "action": "add-snapshot",
        "snapshot": {
            "snapshot-id": 4242,
            "parent-snapshot-id": current.current_snapshot_id,
            "sequence-number": current.last_sequence_number + 1,
            "timestamp-ms": current.last_updated_ms + 1,
            "manifest-list": "/etc/passwd",
            "summary": {"operation": "append"},
            "schema-id": current.current_schema_id,
        },
    }
    answers = {
        "no token": request(uri, "GET", "/v1/namespaces"),
        "made-up token": request(uri, "GET", "/v1/namespaces", token="0" * 64),
        "wrong secret": request(
            uri, "POST", "/v1/oauth/tokens",
            f"grant_type=client_credentials&client_id={user}&client_secret=wrong".encode(), content_type=form,
        ),
        "other grant": request(uri, "POST", "/v1/oauth/tokens", b"grant_type=password", content_type=form),
        "unknown path": request(uri, "GET", "/v1/views", token=token),
        "drop table": request(uri, "DELETE", table, token=token),
        "replace table": request(uri, "PUT", table, b"{}", token=token),
        "create in a mink database": request(
            uri, "POST", "/v1/namespaces/test/tables", json.dumps(create_body("intruder")).encode(), token=token
        ),
        "drop a mink database": request(uri, "DELETE", "/v1/namespaces/test", token=token),
        "namespace elsewhere": request(
            uri, "POST", "/v1/namespaces",
            json.dumps({"namespace": ["evil"], "properties": {"location": "/tmp"}}).encode(), token=token,
        ),
        "namespace escaping": request(
            uri, "POST", "/v1/namespaces", json.dumps({"namespace": [".."]}).encode(), token=token
        ),
        "a mink database's namespace": request(
            uri, "POST", "/v1/namespaces", json.dumps({"namespace": ["test"]}).encode(), token=token
        ),
        "nested namespace created": request(
            uri, "POST", "/v1/namespaces", json.dumps({"namespace": ["a", "b"]}).encode(), token=token
        ),
        "no such table": request(uri, "GET", "/v1/namespaces/test/tables/nothing", token=token),
        "no such namespace": request(uri, "GET", "/v1/namespaces/nothing", token=token),
        "nested namespace": request(uri, "GET", "/v1/namespaces/test%1Fdeeper/tables", token=token),
        "not json": request(uri, "POST", table, b"{not json", token=token),
        "huge body": huge_body(uri, table, token),
        "schema change": request(
            uri, "POST", table,
            json.dumps({"requirements": [], "updates": [{"action": "set-properties", "updates": {"a": "b"}}]}).encode(),
            token=token,
        ),
        "file outside": request(
            uri, "POST", table,
            json.dumps({"requirements": [], "updates": [
                outside,
                {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 4242},
            ]}).encode(),
            token=token,
        ),
        "mink's offsets": request(
            uri, "POST", table,
            json.dumps({"requirements": [], "updates": [
                {**outside, "snapshot": {**outside["snapshot"],
                                         "summary": {"operation": "append", "mink.bucket-offsets": "{}"}}},
            ]}).encode(),
            token=token,
        ),
        "stale requirement": request(
            uri, "POST", table,
            json.dumps({"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 1}],
                        "updates": []}).encode(),
            token=token,
        ),
        "config afterwards": request(uri, "GET", "/v1/config", token=token),
    }
    return {"answers": answers}


def create_body(name: str, **extra) -> dict:
    return {
        "name": name,
        "schema": {
            "type": "struct",
            "schema-id": 0,
            "fields": [{"id": 1, "name": "id", "required": True, "type": "long"}],
        },
        **extra,
    }


def guest(uri: str, user: str, password: str) -> dict:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    rest = catalog(uri, user, password)
    rest.create_namespace("guest")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType(), required=False),
    )
    table = rest.create_table(("guest", "notes"), schema=schema)
    arrow_schema = table.schema().as_arrow()
    for first in (0, 10):
        rows = [{"id": i, "name": f"note-{i}"} for i in range(first, first + 10)]
        table.append(pa.Table.from_pylist(rows, schema=arrow_schema))
    table = rest.load_table(("guest", "notes"))
    ids = sorted(table.scan().to_arrow()["id"].to_pylist())

    token = bearer_token(uri, user, password)
    tables = "/v1/namespaces/guest/tables"
    notes = f"{tables}/notes"
    answers = {
        "location elsewhere": request(
            uri, "POST", tables, json.dumps(create_body("away", location="/tmp/away")).encode(), token=token
        ),
        "files elsewhere": request(
            uri, "POST", tables,
            json.dumps(create_body("away", properties={"write.data.path": "/tmp"})).encode(), token=token,
        ),
        "escaping name": request(uri, "POST", tables, json.dumps(create_body("../up")).encode(), token=token),
        "staged create": request(
            uri, "POST", tables, json.dumps(create_body("staged", **{"stage-create": True})).encode(), token=token
        ),
        "table exists": request(uri, "POST", tables, json.dumps(create_body("notes")).encode(), token=token),
        "namespace exists": request(
            uri, "POST", "/v1/namespaces", json.dumps({"namespace": ["guest"]}).encode(), token=token
        ),
        "move the table": request(
            uri, "POST", notes,
            json.dumps({"requirements": [], "updates": [{"action": "set-location", "location": "/tmp"}]}).encode(),
            token=token,
        ),
        "drop a namespace with tables": request(uri, "DELETE", "/v1/namespaces/guest", token=token),
        "a manifest list elsewhere": request(
            uri, "POST", notes,
            json.dumps({"requirements": [], "updates": [{
                "action": "add-snapshot",
                "snapshot": {
                    "snapshot-id": 4242,
                    "parent-snapshot-id": table.metadata.current_snapshot_id,
                    "sequence-number": table.metadata.last_sequence_number + 1,
                    "timestamp-ms": table.metadata.last_updated_ms + 1,
                    "manifest-list": "/etc/passwd",
                    "summary": {"operation": "append"},
                    "schema-id": table.metadata.current_schema_id,
                },
            }]}).encode(),
            token=token,
        ),
    }
    location = table.metadata.location
    rest.purge_table(("guest", "notes"))
    rest.drop_namespace("guest")
    return {
        "ids": ids,
        "snapshots": len(table.metadata.snapshots),
        "location": location,
        "answers": answers,
        "namespaces": [ns[0] for ns in rest.list_namespaces()],
    }


def main() -> None:
    uri, user, password, step, *args = sys.argv[1:]
    steps = {"read": read, "append": append, "refused": refused, "hostile": hostile, "guest": guest}
    print(json.dumps(steps[step](uri, user, password, *args)))


if __name__ == "__main__":
    main()
