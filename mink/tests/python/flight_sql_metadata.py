"""mink's Flight SQL metadata as the ADBC Flight SQL driver reads it.

Usage: flight_sql_metadata.py URI

Against a `mink server` without a login: creates `shop.orders`, then asserts what a
tool reflecting it through ADBC sees: `get_objects` gives every column its SQL type
name and the table it belongs to, tables and views are typed as `get_table_types`
says, `get_table_schema` gives nullability and the Flight SQL column metadata, and a
result (plain, prepared, or only its schema) carries the metadata too and arrives in
plain Arrow types: a string computed as a view (`substr`) as `string`, never
`string_view`. Prints one JSON line of what the driver reported on success.
"""

import json
import sys

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa

URI = sys.argv[1]

TYPE_NAME = b"ARROW:FLIGHT:SQL:TYPE_NAME"
TABLE_NAME = b"ARROW:FLIGHT:SQL:TABLE_NAME"
SCHEMA_NAME = b"ARROW:FLIGHT:SQL:SCHEMA_NAME"
DB_SCHEMA_NAME = b"ARROW:FLIGHT:SQL:DB_SCHEMA_NAME"
PRECISION = b"ARROW:FLIGHT:SQL:PRECISION"
SCALE = b"ARROW:FLIGHT:SQL:SCALE"
IS_READ_ONLY = b"ARROW:FLIGHT:SQL:IS_READ_ONLY"
KEYS = [
    b"ARROW:FLIGHT:SQL:CATALOG_NAME",
    DB_SCHEMA_NAME,
    SCHEMA_NAME,
    TABLE_NAME,
    TYPE_NAME,
    PRECISION,
    SCALE,
    b"ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT",
    b"ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE",
    IS_READ_ONLY,
    b"ARROW:FLIGHT:SQL:IS_SEARCHABLE",
]

# (column, SQL type name, nullable, precision, scale)
ORDERS = [
    ("id", "BIGINT", False, "19", "0"),
    ("name", "VARCHAR", True, str(2**31 - 1), "0"),
    ("price", "DECIMAL", True, "10", "2"),
    ("day", "DATE", True, "10", "0"),
    ("at", "TIMESTAMP", True, "26", "6"),
]


def equal(actual, expected, what):
    assert actual == expected, f"{what}: {actual!r}, expected {expected!r}"


def check_metadata(field, type_name, table, read_only, what):
    metadata = field.metadata or {}
    missing = [key for key in KEYS if key not in metadata]
    assert not missing, f"{what}: missing {missing} in {metadata}"
    equal(metadata[TYPE_NAME].decode(), type_name, f"{what} type name")
    equal(metadata[TABLE_NAME].decode(), table, f"{what} table")
    equal(metadata[SCHEMA_NAME], metadata[DB_SCHEMA_NAME], f"{what} database keys")
    equal(metadata[IS_READ_ONLY], b"1" if read_only else b"0", f"{what} read-only")


def objects_of(conn, database):
    """{table: (type, [column dicts])} of `database`, from get_objects."""
    found = {}
    reader = conn.adbc_get_objects(depth="columns", db_schema_filter=database)
    for catalog in reader.read_all().to_pylist():
        for db_schema in catalog["catalog_db_schemas"] or []:
            if db_schema["db_schema_name"] != database:
                continue
            for table in db_schema["db_schema_tables"] or []:
                found[table["table_name"]] = (table["table_type"], table["table_columns"])
    return found


def main():
    report = {}
    with flight_sql.connect(URI, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE shop.orders (id BIGINT NOT NULL, name VARCHAR, "
            "price DECIMAL(10, 2), day DATE, at TIMESTAMP(6), "
            "PRIMARY KEY (id)) WITH ('bucket.num' = '2')"
        )
        # A zoned timestamp, as a client's Arrow data creates it.
        zoned = pa.table({"at": pa.array([0], pa.timestamp("us", tz="UTC"))})
        cursor.adbc_ingest("zoned", zoned, mode="create", db_schema_name="shop")
        cursor.execute(
            "INSERT INTO shop.orders VALUES (1, 'widget', 9.99, DATE '2024-01-02', "
            "TIMESTAMP '2024-01-02 03:04:05')"
        )
        cursor.fetchall()

        # get_objects: every column's type name and table.
        table_type, columns = objects_of(conn, "shop")["orders"]
        equal(table_type, "TABLE", "orders' type")
        equal([c["column_name"] for c in columns], [c[0] for c in ORDERS], "columns")
        for column, (name, type_name, nullable, _, _) in zip(columns, ORDERS):
            equal(column["xdbc_type_name"], type_name, f"{name}'s xdbc_type_name")
            equal(column["xdbc_scope_table"], "orders", f"{name}'s table")
            equal(column["xdbc_scope_schema"], "shop", f"{name}'s database")
            equal(column["xdbc_is_autoincrement"], False, f"{name} auto-increment")
            # The driver (1.13) never fills nullability in; if one does, it must be right.
            if column["xdbc_nullable"] is not None:
                equal(column["xdbc_nullable"], int(nullable), f"{name}'s xdbc_nullable")
        report["get_objects_nullability"] = columns[0]["xdbc_nullable"] is not None
        report["get_objects_type_names"] = [c["xdbc_type_name"] for c in columns]

        _, (at,) = objects_of(conn, "shop")["zoned"]
        equal(at["xdbc_type_name"], "TIMESTAMP WITH TIME ZONE", "a zoned timestamp's type name")

        views, _ = objects_of(conn, "system")["buckets"]
        equal(views, "VIEW", "system.buckets' type")
        equal(sorted(conn.adbc_get_table_types()), ["TABLE", "VIEW"], "table types")

        # get_table_schema: nullability and the metadata JDBC's getColumns reads.
        schema = conn.adbc_get_table_schema("orders", db_schema_filter="shop")
        for field, (name, type_name, nullable, precision, scale) in zip(schema, ORDERS):
            equal(field.nullable, nullable, f"{name}'s nullability")
            check_metadata(field, type_name, "orders", False, name)
            equal(field.metadata[PRECISION].decode(), precision, f"{name}'s precision")
            equal(field.metadata[SCALE].decode(), scale, f"{name}'s scale")

        # A result: the table's columns name it, computed ones nothing; views arrive plain.
        sql = (
            "SELECT o.id, o.name AS label, substr(o.name, 1, 2) AS head, "
            "arrow_cast(arrow_cast(o.name, 'Binary'), 'BinaryView') AS raw "
            "FROM shop.orders o"
        )
        cursor.execute(sql)
        result = cursor.fetch_arrow_table()
        equal(result.to_pylist(), [{"id": 1, "label": "widget", "head": "wi", "raw": b"widget"}], "rows")
        equal(result.schema.field("head").type, pa.string(), "a computed string's type")
        equal(result.schema.field("raw").type, pa.binary(), "computed bytes' type")
        check_metadata(result.schema.field("id"), "BIGINT", "orders", False, "id")
        check_metadata(result.schema.field("label"), "VARCHAR", "orders", False, "label")
        check_metadata(result.schema.field("head"), "VARCHAR", "", True, "head")
        check_metadata(result.schema.field("raw"), "BYTEA", "", True, "raw")
        equal(result.schema.field("id").nullable, False, "id's nullability in a result")

        # Its schema alone (GetSchema) and a prepared statement's: the same.
        equal(cursor.adbc_execute_schema(sql), result.schema, "the schema without running")
        cursor.execute("SELECT substr(name, 1, 2) AS head FROM shop.orders WHERE id = ?", (1,))
        prepared = cursor.fetch_arrow_table()
        equal(prepared.schema.field("head").type, pa.string(), "a prepared result's type")
        check_metadata(prepared.schema.field("head"), "VARCHAR", "", True, "prepared head")

        # A changelog's columns are read-only.
        cursor.execute('SELECT id FROM shop."orders$changelog"')
        changelog = cursor.fetch_arrow_table()
        check_metadata(changelog.schema.field("id"), "BIGINT", "orders$changelog", True, "changelog id")

    print(json.dumps(report))


if __name__ == "__main__":
    main()
