"""The mink:// SQLAlchemy dialect (python/mink-sqlalchemy) against a real `mink server`,
under whichever SQLAlchemy this interpreter has (1.4 or 2.x):

* reflection of every table kind: log and primary-key tables (with their types,
  nullability and primary keys), a table made by the dialect's own DDL, the `system` and
  `information_schema` views; schemas; a missing table;
* bound parameters (executemany inserts, text() and Core selects, IN lists, literal
  LIMIT/OFFSET, literals with quotes and backslashes);
* every time grain of the Superset engine spec's expressions, and its epoch and
  datetime-literal expressions, checked against Python's own bucketing;
* pandas' read_sql, read_sql_table and to_sql;
* a login, a refused one, no login where one is needed; TLS with the CA as a URL
  parameter or as connect_args, and plaintext against a TLS port.
* the examples of python/mink-sqlalchemy/README.md, run as written.

Usage: sqlalchemy_dialect.py --plain HOST:PORT --tls HOST:PORT --ca CA.pem --user U
--password P. `--plain` serves plaintext with that login, `--tls` TLS (a certificate
for `localhost`) with the same login. Prints one JSON line of what it checked.
"""

import argparse
import collections
import contextlib
import datetime
import decimal
import doctest
import io
import json
import pathlib
import random
import re
import sys
import warnings

import pandas as pd
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy import types as sqltypes

from mink_sqlalchemy import dialect as mink_dialect
from mink_sqlalchemy import expressions
from mink_sqlalchemy import flight as mink_flight
from mink_sqlalchemy import target as mink_target
from mink_sqlalchemy import types as mink_types
from mink_sqlalchemy.expressions import (
    EPOCH_MS_TO_DTTM,
    EPOCH_TO_DTTM,
    TIME_GRAIN_EXPRESSIONS,
    datetime_literal,
)
from mink_sqlalchemy.types import from_arrow, from_type_name, sql_name

# A warning of SQLAlchemy's says the dialect does something wrong (a reflection that
# failed) or uses an API the other version lacks. SQLAlchemy 1.4's warnings about the
# 2.0 style concern this script's own 1.4-style calls.
warnings.simplefilter("error", sa_exc.SAWarning)
warnings.simplefilter("error", sa_exc.SADeprecationWarning)
if hasattr(sa_exc, "RemovedIn20Warning"):
    warnings.simplefilter("ignore", sa_exc.RemovedIn20Warning)

EPOCH = datetime.datetime(1970, 1, 1)
SA_VERSION = sa.__version__


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def equal(actual, expected, what):
    check(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


# -- Python's bucketing, what each grain must give ------------------------------------


def week_start(dt, weekday):
    """The day `weekday` (0 = Monday) on or before `dt`, at midnight."""
    day = datetime.datetime(dt.year, dt.month, dt.day)
    return day - datetime.timedelta(days=(day.weekday() - weekday) % 7)


def bin_of(dt, seconds):
    step = datetime.timedelta(seconds=seconds)
    return EPOCH + ((dt - EPOCH) // step) * step


GRAINS = {
    "PT1S": lambda d: d.replace(microsecond=0),
    "PT5S": lambda d: bin_of(d, 5),
    "PT30S": lambda d: bin_of(d, 30),
    "PT1M": lambda d: d.replace(second=0, microsecond=0),
    "PT5M": lambda d: bin_of(d, 300),
    "PT10M": lambda d: bin_of(d, 600),
    "PT15M": lambda d: bin_of(d, 900),
    "PT30M": lambda d: bin_of(d, 1800),
    "PT1H": lambda d: d.replace(minute=0, second=0, microsecond=0),
    "PT6H": lambda d: bin_of(d, 6 * 3600),
    "P1D": lambda d: datetime.datetime(d.year, d.month, d.day),
    "P1W": lambda d: week_start(d, 0),
    "P1M": lambda d: datetime.datetime(d.year, d.month, 1),
    "P3M": lambda d: datetime.datetime(d.year, 3 * ((d.month - 1) // 3) + 1, 1),
    "P1Y": lambda d: datetime.datetime(d.year, 1, 1),
    "1969-12-28T00:00:00Z/P1W": lambda d: week_start(d, 6),
    "1969-12-29T00:00:00Z/P1W": lambda d: week_start(d, 0),
    "P1W/1970-01-03T00:00:00Z": lambda d: week_start(d, 6) + datetime.timedelta(days=6),
    "P1W/1970-01-04T00:00:00Z": lambda d: week_start(d, 0) + datetime.timedelta(days=6),
}
DAY_GRAINS = [g for g in GRAINS if g.startswith("P") and not g.startswith("PT") or "/" in g]


def naive_utc(value):
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return datetime.datetime(value.year, value.month, value.day)
    return value


# -- the data ---------------------------------------------------------------------------


def make_rows():
    rng = random.Random(49)
    start = datetime.datetime(2023, 12, 30, 22, 58, 1, 500000)
    rows = []
    for i in range(240):
        ts = start + datetime.timedelta(seconds=rng.randrange(0, 800 * 86400), microseconds=rng.randrange(0, 10**6))
        if i % 40 == 0:  # exact boundaries: midnight of a Sunday, a month's first second
            ts = datetime.datetime(2024, 3, 3) + datetime.timedelta(days=i // 40)
        rows.append(
            {
                "id": i,
                "ts": ts,
                "name": None if i % 7 == 0 else f"name-{i % 5}",
                "amount": i * 1.5,
                "price": decimal.Decimal(i) / 4,
                "flag": i % 2 == 0,
                "day": ts.date(),
                "small": i % 100,
                "epoch_s": int((ts - EPOCH).total_seconds()),
                "epoch_ms": (ts - EPOCH) // datetime.timedelta(milliseconds=1),
            }
        )
    return rows


LOG_DDL = (
    "CREATE TABLE sa.log_t (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, name VARCHAR, "
    "amount DOUBLE, price DECIMAL(10, 2), flag BOOLEAN, day DATE, small SMALLINT, "
    "epoch_s BIGINT, epoch_ms BIGINT)"
)
PK_DDL = (
    "CREATE TABLE sa.pk_t (region VARCHAR NOT NULL, id BIGINT NOT NULL, v VARCHAR, "
    "n INT, PRIMARY KEY (region, id)) WITH ('bucket.num' = '2')"
)


def setup(engine, rows):
    with engine.connect() as conn:
        for table in ("log_t", "pk_t", "made", "zoned", "from_pandas", "keyed"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS sa.{table}")
        conn.exec_driver_sql(LOG_DDL)
        conn.exec_driver_sql(PK_DDL)
        # A zoned timestamp column made by an ingest of an Arrow table, which keeps its
        # zone (SQL's TIMESTAMP WITH TIME ZONE makes a UTC one too).
        zoned = pa.table(
            {
                "id": pa.array([r["id"] for r in rows], pa.int64()),
                "at": pa.array(
                    [r["ts"].replace(tzinfo=datetime.timezone.utc) for r in rows],
                    pa.timestamp("us", tz="UTC"),
                ),
            }
        )
        cursor = mink_dialect._raw(conn).cursor()
        try:
            cursor.adbc_ingest("zoned", zoned, mode="create", db_schema_name="sa")
        finally:
            cursor.close()


# -- reflection -------------------------------------------------------------------------


def columns_of(inspector, table, schema):
    return [(c["name"], type(c["type"]).__name__, c["nullable"]) for c in inspector.get_columns(table, schema)]


def check_reflection(engine, after_pandas=False):
    # The dialect's own DDL: types, NOT NULL, the primary key and mink's WITH options.
    metadata = sa.MetaData()
    made = sa.Table(
        "made",
        metadata,
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("label", sa.String(40), nullable=False),
        sa.Column("at", sa.DateTime),
        sa.Column("score", sa.Float),
        sa.Column("ratio", sa.Float(precision=10)),
        sa.Column("blob", sa.LargeBinary),
        sa.Column("ok", sa.Boolean),
        sa.Column("note", sa.Text),
        sa.Column("key", sa.Integer),  # a keyword as a column name, quoted
        schema="sa",
        mink_with={"bucket.num": "2"},
    )
    metadata.create_all(engine)
    metadata.create_all(engine)  # checks it exists, creates nothing

    inspector = sa.inspect(engine)
    schemas = inspector.get_schema_names()
    for schema in ("default", "sa", "system", "information_schema"):
        check(schema in schemas, f"schema {schema} in {schemas}")
    tables = ["log_t", "made", "pk_t", "zoned"]
    if after_pandas:
        tables = sorted(tables + ["from_pandas", "keyed"])
    equal(inspector.get_table_names("sa"), tables, "tables of sa")
    equal(inspector.get_view_names("sa"), [], "views of sa")
    equal(inspector.get_table_names("system"), [], "system has views only")
    equal(set(inspector.get_view_names("system")) >= {"buckets", "lake_snapshots", "lake_tables"}, True,
          f"system views {inspector.get_view_names('system')}")
    equal(set(inspector.get_view_names("information_schema")) >= {"tables", "columns", "schemata", "routines"},
          True, "information_schema views")

    equal(
        columns_of(inspector, "log_t", "sa"),
        [
            ("id", "BIGINT", False),
            ("ts", "TIMESTAMP", False),
            ("name", "VARCHAR", True),
            ("amount", "DOUBLE", True),
            ("price", "DECIMAL", True),
            ("flag", "BOOLEAN", True),
            ("day", "DATE", True),
            ("small", "SMALLINT", True),
            ("epoch_s", "BIGINT", True),
            ("epoch_ms", "BIGINT", True),
        ],
        "columns of the log table",
    )
    price = next(c for c in inspector.get_columns("log_t", "sa") if c["name"] == "price")["type"]
    equal((price.precision, price.scale), (10, 2), "DECIMAL(10, 2)")
    equal(inspector.get_pk_constraint("log_t", "sa")["constrained_columns"], [], "a log table has no key")

    equal(
        columns_of(inspector, "pk_t", "sa"),
        [("region", "VARCHAR", False), ("id", "BIGINT", False), ("v", "VARCHAR", True), ("n", "INTEGER", True)],
        "columns of the primary-key table",
    )
    equal(inspector.get_pk_constraint("pk_t", "sa")["constrained_columns"], ["region", "id"],
          "the primary key, in key order")

    equal(
        columns_of(inspector, "made", "sa"),
        [
            ("id", "BIGINT", False),
            ("label", "VARCHAR", False),
            ("at", "TIMESTAMP", True),
            ("score", "DOUBLE", True),
            ("ratio", "REAL", True),
            ("blob", "VARBINARY", True),
            ("ok", "BOOLEAN", True),
            ("note", "VARCHAR", True),
            ("key", "INTEGER", True),
        ],
        "columns of the table the dialect's DDL made",
    )
    equal(inspector.get_pk_constraint("made", "sa")["constrained_columns"], ["id"], "its key")
    zoned_at = inspector.get_columns("zoned", "sa")[1]["type"]
    check(isinstance(zoned_at, sqltypes.TIMESTAMP) and zoned_at.timezone, f"a zoned timestamp: {zoned_at!r}")

    # system views (in information_schema.columns) and information_schema views (not
    # there: read from the statement's schema).
    buckets = dict((n, (t, null)) for n, t, null in columns_of(inspector, "buckets", "system"))
    equal(buckets["table_name"], ("VARCHAR", False), "system.buckets.table_name")
    equal(buckets["bucket"], ("BIGINT", False), "system.buckets.bucket (UInt32)")
    equal(buckets["lake_snapshot_id"], ("BIGINT", True), "system.buckets.lake_snapshot_id")
    equal(
        columns_of(inspector, "tables", "information_schema"),
        [("table_catalog", "VARCHAR", False), ("table_schema", "VARCHAR", False),
         ("table_name", "VARCHAR", False), ("table_type", "VARCHAR", False)],
        "information_schema.tables",
    )
    equal(inspector.get_pk_constraint("buckets", "system")["constrained_columns"], [], "views have no key")
    equal(inspector.get_foreign_keys("pk_t", "sa"), [], "no foreign keys")
    equal(inspector.get_indexes("pk_t", "sa"), [], "no indexes")

    check(inspector.has_table("pk_t", "sa"), "has_table")
    with engine.connect() as conn:
        check(engine.dialect.has_table(conn, "log_t", "sa"), "has_table log_t")
        check(not engine.dialect.has_table(conn, "missing", "sa"), "no table missing")
    try:
        inspector.get_columns("missing", "sa")
        raise AssertionError("a missing table reflects")
    except sa_exc.NoSuchTableError:
        pass

    # Whole-table reflection, as ORMs and Superset do it.
    reflected = sa.Table("pk_t", sa.MetaData(), schema="sa", autoload_with=engine)
    equal([c.name for c in reflected.primary_key.columns], ["region", "id"], "autoloaded key")
    everything = sa.MetaData()
    everything.reflect(engine, schema="sa")
    check({"sa.log_t", "sa.pk_t", "sa.made", "sa.zoned"} <= set(everything.tables), f"{everything.tables}")

    # Which column source answered: the table schema's Flight SQL column metadata, when
    # the server sends it, else information_schema; both must agree where both answer,
    # and each SQL type name the server sends must read as the Arrow type it labels.
    simplify = lambda cols: [(c["name"], repr(c["type"]), c["nullable"]) for c in cols]
    with engine.connect() as conn:
        for table in ("log_t", "pk_t", "made", "zoned"):
            from_flight = engine.dialect._columns_from_flight_metadata(conn, "sa", table)
            from_schema = engine.dialect._columns_from_information_schema(conn, "sa", table)
            if from_flight:
                equal(simplify(from_flight), simplify(from_schema), f"Flight SQL metadata and information_schema of {table}")
            raw = mink_dialect._raw(conn)
            for field in raw.adbc_get_table_schema(table, db_schema_filter="sa"):
                name = (field.metadata or {}).get(b"ARROW:FLIGHT:SQL:TYPE_NAME")
                if name is not None:
                    named, arrow = from_type_name(name.decode()), from_arrow(field.type)
                    equal((type(named).__name__, getattr(named, "timezone", None)),
                          (type(arrow).__name__, getattr(arrow, "timezone", None)),
                          f"type name {name!r} of {table}.{field.name} ({field.type})")
    return "flight" if from_flight else "information_schema"


# -- parameters -------------------------------------------------------------------------


def check_parameters(engine, rows):
    metadata = sa.MetaData()
    log_t = sa.Table("log_t", metadata, schema="sa", autoload_with=engine)
    pk_t = sa.Table("pk_t", metadata, schema="sa", autoload_with=engine)
    with engine.connect() as conn:
        conn.execute(log_t.insert(), rows)  # executemany, ? parameters
        conn.execute(
            pk_t.insert(),
            [{"region": r, "id": i, "v": f"{r}{i}", "n": i} for r in ("eu", "us") for i in range(5)],
        )
        # An upsert by key through text() with named parameters.
        conn.execute(sa.text("INSERT INTO sa.pk_t VALUES (:r, :i, :v, :n)"), {"r": "eu", "i": 1, "v": "new", "n": None})
        equal(conn.execute(sa.select(sa.func.count()).select_from(log_t)).scalar(), len(rows), "rows inserted")
        equal(conn.execute(sa.select(sa.func.count()).select_from(pk_t)).scalar(), 10, "keys")

        got = conn.execute(sa.select(pk_t.c.v, pk_t.c.n).where(pk_t.c.region == "eu", pk_t.c.id == 1)).one()
        equal(tuple(got), ("new", None), "the upserted row")
        updated = conn.execute(sa.text("UPDATE sa.pk_t SET v = :v WHERE region = :r AND id < :n"), {"v": "x", "r": "us", "n": 3})
        equal(updated.rowcount, 3, "an UPDATE's rowcount")

        # Parameters of every type, in a Core select.
        some = rows[17]
        query = sa.select(log_t.c.id).where(
            log_t.c.ts == some["ts"],
            log_t.c.amount == some["amount"],
            log_t.c.flag == some["flag"],
            log_t.c.day == some["day"],
            log_t.c.price == some["price"],
            log_t.c.name == some["name"],
        )
        equal(conn.execute(query).scalars().all(), [17], "a select on bound values of every type")
        ids = conn.execute(sa.select(log_t.c.id).where(log_t.c.id.in_([3, 5, 8])).order_by(log_t.c.id)).scalars().all()
        equal(ids, [3, 5, 8], "an IN list")
        page = conn.execute(sa.select(log_t.c.id).order_by(log_t.c.id).limit(3).offset(10)).scalars().all()
        equal(page, [10, 11, 12], "LIMIT and OFFSET")
        page = conn.execute(sa.select(log_t.c.id).order_by(log_t.c.id).offset(len(rows) - 2)).scalars().all()
        equal(page, [len(rows) - 2, len(rows) - 1], "OFFSET alone")
        page = conn.execute(sa.select(log_t.c.id).order_by(log_t.c.id).fetch(2).offset(5)).scalars().all()
        equal(page, [5, 6], "FETCH FIRST as LIMIT")
        matched = conn.execute(
            sa.select(sa.func.count()).select_from(log_t).where(log_t.c.name.regexp_match("^name-[12]$"))
        ).scalar()
        equal(matched, sum(1 for r in rows if r["name"] in ("name-1", "name-2")), "a regular expression")
        named = conn.execute(sa.text("SELECT count(*) FROM sa.log_t WHERE name = :n AND id < :i"), {"n": "name-1", "i": 100})
        equal(named.scalar(), sum(1 for r in rows if r["name"] == "name-1" and r["id"] < 100), "text() parameters")
        low, high = sorted([rows[0]["ts"], rows[1]["ts"]])
        ranged = conn.execute(
            sa.select(sa.func.count()).select_from(log_t).where(log_t.c.ts.between(low, high))
        ).scalar()
        equal(ranged, sum(1 for r in rows if low <= r["ts"] <= high), "a range of datetimes")

        # Literals rendered by the dialect (what Superset's compiled queries hold).
        tricky = "it's a \\path\\ 100%"
        literal = sa.select(sa.literal(tricky, sa.String).label("s"), sa.literal(some["ts"], sa.DateTime).label("t"))
        sql = str(literal.compile(engine, compile_kwargs={"literal_binds": True}))
        got = conn.exec_driver_sql(sql).one()
        equal((got[0], naive_utc(got[1])), (tricky, some["ts"]), f"literals of {sql}")

        # DDL and DML through the update path answer no rows; errors are DBAPI errors.
        try:
            conn.exec_driver_sql("SELECT * FROM sa.nope")
            raise AssertionError("a missing table answered")
        except sa_exc.DBAPIError as error:
            check("not found" in str(error), str(error))


# -- time grains ------------------------------------------------------------------------


def grain_rows(conn, expression, table):
    sql = f"SELECT {expression} AS g, count(*) AS n FROM sa.{table} GROUP BY 1 ORDER BY 1"
    return [(naive_utc(g), n) for g, n in conn.exec_driver_sql(sql).fetchall()]


def expected_buckets(values, bucket):
    counted = collections.Counter(bucket(v) for v in values)
    return sorted(counted.items())


def check_time_grains(engine, rows):
    timestamps = [r["ts"] for r in rows]
    days = [datetime.datetime(r["day"].year, r["day"].month, r["day"].day) for r in rows]
    seconds = [EPOCH + datetime.timedelta(seconds=r["epoch_s"]) for r in rows]
    millis = [EPOCH + datetime.timedelta(milliseconds=r["epoch_ms"]) for r in rows]
    checked = 0
    with engine.connect() as conn:
        equal(set(GRAINS) | {None}, set(TIME_GRAIN_EXPRESSIONS), "every grain the spec has is checked")
        for grain, bucket in GRAINS.items():
            expression = TIME_GRAIN_EXPRESSIONS[grain]
            cases = [("log_t", "ts", timestamps), ("zoned", "at", timestamps)]
            if grain in DAY_GRAINS:
                cases.append(("log_t", "day", days))
            cases.append(("log_t", EPOCH_TO_DTTM.format(col="epoch_s"), seconds))
            cases.append(("log_t", EPOCH_MS_TO_DTTM.format(col="epoch_ms"), millis))
            for table, column, values in cases:
                sql = expression.format(col=column)
                equal(grain_rows(conn, sql, table), expected_buckets(values, bucket), f"grain {grain} of {table}.{column}: {sql}")
                checked += 1
        # A time-range filter as Superset writes it.
        since = datetime.datetime(2024, 6, 1, 12, 0, 0)
        for table, column in (("log_t", "ts"), ("zoned", "at")):
            literal = datetime_literal("TIMESTAMP", since)
            n = conn.exec_driver_sql(f"SELECT count(*) FROM sa.{table} WHERE {column} >= {literal}").scalar()
            equal(n, sum(1 for t in timestamps if t >= since), f"{column} >= {literal}")
        literal = datetime_literal("DATE", since)
        n = conn.exec_driver_sql(f"SELECT count(*) FROM sa.log_t WHERE day >= {literal}").scalar()
        equal(n, sum(1 for r in rows if r["day"] >= since.date()), f"day >= {literal}")
    return checked


# -- pandas -----------------------------------------------------------------------------


def check_pandas(engine, rows):
    with engine.connect() as conn:
        frame = pd.read_sql(
            sa.text("SELECT id, ts, name, amount FROM sa.log_t WHERE id < :n ORDER BY id"), conn, params={"n": 10}
        )
    equal(list(frame.columns), ["id", "ts", "name", "amount"], "read_sql columns")
    equal(frame["id"].tolist(), list(range(10)), "read_sql ids")
    equal([naive_utc(t) for t in frame["ts"]], [r["ts"] for r in rows[:10]], "read_sql timestamps")

    table = pd.read_sql_table("pk_t", engine, schema="sa")
    equal(sorted(zip(table["region"], table["id"])), sorted((r, i) for r in ("eu", "us") for i in range(5)),
          "read_sql_table")

    written = pd.DataFrame({"k": [1, 2, 3], "label": ["a", None, "c"], "x": [0.5, 1.5, None]})
    written.to_sql("from_pandas", engine, schema="sa", index=False)
    back = pd.read_sql(sa.text("SELECT k, label, x FROM sa.from_pandas ORDER BY k"), engine)
    equal(back["k"].tolist(), [1, 2, 3], "to_sql then read_sql")
    equal([None if pd.isna(v) else v for v in back["label"]], ["a", None, "c"], "to_sql strings")
    inspector = sa.inspect(engine)
    equal(columns_of(inspector, "from_pandas", "sa")[0][:2], ("k", "BIGINT"), "to_sql's table")

    # to_sql appending to a partitioned primary-key table made by the dialect's DDL:
    # an upsert by key, the last row of a key winning.
    metadata = sa.MetaData()
    sa.Table(
        "keyed",
        metadata,
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("v", sa.String),
        schema="sa",
        mink_with={"bucket.num": "2"},
        mink_partitioned_by=["day"],
    )
    metadata.create_all(engine)
    first, second = datetime.date(2024, 1, 1), datetime.date(2024, 1, 2)
    upserts = pd.DataFrame({"day": [first, first, second], "id": [1, 1, 1], "v": ["a", "b", "c"]})
    upserts.to_sql("keyed", engine, schema="sa", index=False, if_exists="append")
    back = pd.read_sql(sa.text("SELECT day, id, v FROM sa.keyed ORDER BY day"), engine)
    equal([(pd.Timestamp(d).date(), i, v) for d, i, v in back.itertuples(index=False)],
          [(first, 1, "b"), (second, 1, "c")], "upserted by key")
    with engine.connect() as conn:
        partitions = conn.exec_driver_sql(
            "SELECT DISTINCT partition FROM system.buckets WHERE table_name = 'sa.keyed' ORDER BY 1"
        ).scalars().all()
    equal(partitions, ["day=2024-01-01", "day=2024-01-02"], "PARTITIONED BY from mink_partitioned_by")
    equal(inspector.get_pk_constraint("keyed", "sa")["constrained_columns"], ["day", "id"], "its key")
    return len(frame)


# -- logins and TLS ---------------------------------------------------------------------


def refused(url, **kwargs):
    engine = sa.create_engine(url, **kwargs)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1").scalar()
    except sa_exc.OperationalError as error:
        return str(error)
    finally:
        engine.dispose()
    raise AssertionError(f"{url} connected")


def check_logins(args):
    text = refused(f"mink://{args.user}:wrong@{args.plain}")
    check("refused the login: wrong user or password" in text, text)
    check("wrong" not in text.split("refused")[0], f"the message names no password: {text}")
    text = refused(f"mink://{args.plain}")
    check("requires a user and password" in text, text)

    try:
        sa.create_engine(f"mink://{args.plain}?tls=maybe")
        raise AssertionError("tls=maybe accepted")
    except sa_exc.ArgumentError as error:
        check("tls='maybe'" in str(error), str(error))
    try:
        sa.create_engine(f"mink://{args.plain}?colour=red")
        raise AssertionError("an unknown parameter accepted")
    except sa_exc.ArgumentError as error:
        check("colour" in str(error), str(error))


def check_tls(args):
    secure = f"mink://{args.user}:{args.password}@{args.tls}?tls=true&tls_ca={args.ca}"
    engine = sa.create_engine(secure)
    with engine.connect() as conn:
        equal(conn.exec_driver_sql("SELECT 41 + 1").scalar(), 42, "a query over TLS")
        conn.exec_driver_sql("DROP TABLE IF EXISTS sa.tls_t")
        conn.exec_driver_sql("CREATE TABLE sa.tls_t (a VARCHAR NOT NULL, b BIGINT NOT NULL, PRIMARY KEY (b, a))")
    equal(sa.inspect(engine).get_pk_constraint("tls_t", "sa")["constrained_columns"], ["b", "a"],
          "primary keys over TLS (Flight with the same CA)")
    engine.dispose()

    with open(args.ca, encoding="utf-8") as pem:
        ca = pem.read()
    engine = sa.create_engine(f"mink://{args.user}:{args.password}@{args.tls}", connect_args={"tls_root_certs": ca})
    with engine.connect() as conn:
        equal(conn.exec_driver_sql("SELECT 1").scalar(), 1, "the CA as connect_args")
    engine.dispose()

    text = refused(f"mink://{args.user}:{args.password}@{args.tls}")
    check("cannot reach mink at grpc://" in text, f"plaintext to a TLS port: {text}")
    text = refused(f"mink://{args.user}:{args.password}@{args.tls}?tls=true")
    check("cannot reach mink at grpc+tls://" in text and "certificate" in text, f"an untrusted certificate: {text}")


def check_pure_parts():
    """The parts that need no server: the modules' examples, type names both ways."""
    for module in (mink_types, expressions, mink_flight, mink_target):
        equal(doctest.testmod(module).failed, 0, f"the examples of {module.__name__}")
    equal(repr(from_type_name('Timestamp(µs, "UTC")')), "TIMESTAMP(timezone=True)", "a zoned Arrow timestamp")
    equal(from_type_name("Timestamp(ns)").timezone, False, "a zoneless one")
    equal(from_type_name("Timestamp(Microsecond, Some(\"UTC\"))").timezone, True, "arrow-rs's older form")
    equal(from_type_name("Timestamp(Nanosecond, None)").timezone, False, "arrow-rs's older zoneless form")
    equal(from_type_name("TIMESTAMP WITH TIME ZONE").timezone, True, "an SQL zoned timestamp")
    equal(from_type_name("TIMESTAMP(3) WITH TIME ZONE").timezone, True, "with a precision")
    equal((from_type_name("Decimal128(38, 10)").precision, from_type_name("Decimal128(38, 10)").scale), (38, 10), "Decimal128")
    equal(type(from_type_name("List(Int64)").item_type).__name__, "BIGINT", "an Arrow list")
    equal(type(from_type_name("BIGINT[]").item_type).__name__, "BIGINT", "an SQL array")
    equal(type(from_type_name("Dictionary(Int32, Utf8)")).__name__, "VARCHAR", "a dictionary")
    equal(type(from_type_name("Utf8View")).__name__, "VARCHAR", "a string view")
    equal(type(from_type_name("DOUBLE PRECISION")).__name__, "DOUBLE", "DOUBLE PRECISION")
    equal(from_type_name("Struct(a Int64)").get_col_spec(), "Struct(a Int64)", "an opaque type keeps its name")
    equal(sql_name(pa.timestamp("us", tz="UTC")), "TIMESTAMP WITH TIME ZONE", "result type names")
    equal(sql_name(pa.string_view()) if hasattr(pa, "string_view") else "VARCHAR", "VARCHAR", "string_view")
    equal(sql_name(pa.int64()), "BIGINT", "int64")
    equal(sql_name(pa.float64()), "DOUBLE", "float64")
    equal(sql_name(pa.decimal128(10, 2)), "DECIMAL(10, 2)", "decimal")
    equal(sql_name("not a type"), None, "not a type")


def check_readme_examples(args):
    """The README's examples, its ``python`` blocks in order in one namespace, against
    the plain server: they run as written (only their URL is this server's), and leave
    the table they describe."""
    readme = pathlib.Path(__file__).parents[3] / "python/mink-sqlalchemy/README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    check(len(blocks) >= 3, f"the README's examples: {len(blocks)} blocks")
    url = f"mink://{args.user}:{args.password}@{args.plain}"
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS shop.orders")
    engine.dispose()
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        for block in blocks:
            exec(block.replace("mink://analyst:s3cret@127.0.0.1:50051", url), namespace)
    namespace["engine"].dispose()
    lines = printed.getvalue().splitlines()
    equal(lines[0], "15.0", "the README's sum")
    equal(lines[2], "['id']", "the README's primary key")
    equal(namespace["orders"]["amount"].tolist(), [15.0, 30.0], "the README's orders")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--plain", required=True)
    parser.add_argument("--tls", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    args = parser.parse_args()

    check_pure_parts()
    engine = sa.create_engine(f"mink://{args.user}:{args.password}@{args.plain}")
    equal(engine.dialect.name, "mink", "the entry point's dialect")
    rows = make_rows()
    setup(engine, rows)
    check_parameters(engine, rows)
    source = check_reflection(engine)
    grains = check_time_grains(engine, rows)
    pandas_rows = check_pandas(engine, rows)
    check_reflection(engine, after_pandas=True)
    check_logins(args)
    check_tls(args)
    check_readme_examples(args)
    engine.dispose()
    print(json.dumps({
        "sqlalchemy": SA_VERSION,
        "pandas": pd.__version__,
        "column_metadata": source,
        "grain_queries": grains,
        "pandas_rows": pandas_rows,
    }))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print(f"FAILED under SQLAlchemy {SA_VERSION}: {error}", file=sys.stderr)
        raise
