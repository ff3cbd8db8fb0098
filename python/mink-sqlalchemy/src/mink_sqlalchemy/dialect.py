"""The ``mink://`` SQLAlchemy dialect, on ADBC's Flight SQL driver.

::

    from sqlalchemy import create_engine, inspect, text

    engine = create_engine("mink://analyst:s3cret@db.example.com:50051?tls=true")
    with engine.connect() as conn:
        conn.execute(text("SELECT count(*) FROM demo.events WHERE kind = :k"), {"k": "click"})
    inspect(engine).get_columns("events", schema="demo")

Statements go to mink's Flight SQL endpoint through ``adbc_driver_flightsql.dbapi``
(``?`` parameters, bound by the server). mink has no transactions: every statement is
durable when it answers, so the dialect runs in autocommit and ``commit``/``rollback``
do nothing.

Reflection reads what mink serves today and uses richer metadata where the server
sends it:

* schemas, tables and views from ``information_schema`` (``SHOW TABLES`` calls mink's
  tables ``BASE TABLE`` and the ``system`` and ``information_schema`` tables ``VIEW``);
* columns from the table's Arrow schema as Flight SQL's ``GetTables`` sends it, when
  its fields carry Flight SQL column metadata naming the table, else from
  ``information_schema.columns`` (types as DataFusion prints Arrow types), else, for the
  ``information_schema`` views that list nothing there, from the Arrow schema of
  ``SELECT *`` (Flight SQL ``GetSchema``: nothing runs);
* primary keys from Flight SQL ``GetPrimaryKeys`` (see :mod:`mink_sqlalchemy.flight`);
* no foreign keys, indexes, unique or check constraints: mink has none.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Dict, List, Optional, Tuple

import sqlalchemy
from sqlalchemy import exc, util
from sqlalchemy import schema as sa_schema
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import default, reflection
from sqlalchemy.sql import compiler

from . import flight
from .target import Target, UrlError
from .types import from_arrow, from_type_name

__all__ = ["MinkDialect"]

SQLALCHEMY_2 = int(sqlalchemy.__version__.split(".")[0]) >= 2

#: The catalog mink's Flight SQL endpoint names.
CATALOG = "mink"
#: The database unqualified table names are in.
DEFAULT_SCHEMA = "default"

# Words DataFusion's parser takes as keywords in some position, quoted whenever they name
# something (a quoted lowercase name is the same name): `default` is a database, `key`,
# `value` and `timestamp` are common column names.
_RESERVED = {
    "all", "and", "any", "array", "as", "asc", "between", "by", "call", "case", "cast",
    "column", "create", "cross", "current_date", "current_time", "current_timestamp",
    "date", "day", "default", "delete", "desc", "describe", "distinct", "drop", "else",
    "end", "except", "exists", "explain", "false", "filter", "following", "for", "from",
    "full", "group", "having", "hour", "in", "inner", "insert", "intersect", "interval",
    "into", "is", "join", "key", "lateral", "left", "like", "limit", "map", "minute",
    "month", "natural", "not", "null", "offset", "on", "or", "order", "outer", "over",
    "partition", "partitioned", "preceding", "primary", "range", "right", "row", "rows",
    "second", "select", "set", "show", "struct", "system", "table", "tables", "then",
    "time", "timestamp", "to", "true", "union", "unnest", "update", "user", "using",
    "value", "values", "when", "where", "window", "with", "year",
}


class MinkIdentifierPreparer(compiler.IdentifierPreparer):
    """Double-quoted identifiers; a name with anything but letters, digits and ``_``
    (``t$lake``), an upper-case letter or a keyword is quoted."""

    reserved_words = compiler.RESERVED_WORDS | _RESERVED
    legal_characters = re.compile(r"^[A-Z0-9_]+$", re.I)


class MinkCompiler(compiler.SQLCompiler):
    """DataFusion's SQL, which takes no parameter in ``LIMIT`` or ``OFFSET``."""

    def limit_clause(self, select: Any, **kw: Any) -> str:
        return self._limit_offset(select._limit_clause, select._offset_clause, **kw)

    def fetch_clause(self, select: Any, **kw: Any) -> str:
        # FETCH FIRST n ROWS ONLY, as LIMIT (DataFusion has no FETCH).
        options = getattr(select, "_fetch_clause_options", None) or {}
        if options.get("percent") or options.get("with_ties"):
            raise exc.CompileError("mink has no FETCH ... PERCENT or WITH TIES")
        return self._limit_offset(select._fetch_clause, select._offset_clause, **kw)

    def _limit_offset(self, limit: Any, offset: Any, **kw: Any) -> str:
        """``LIMIT n OFFSET m`` with each number written into the statement."""
        kw = {**kw, "literal_execute": True}
        text = ""
        if limit is not None:
            text += "\n LIMIT " + self.process(limit, **kw)
        if offset is not None:
            text += "\n OFFSET " + self.process(offset, **kw)
        return text

    def visit_regexp_match_op_binary(self, binary: Any, operator: Any, **kw: Any) -> str:
        return self._generate_generic_binary(binary, " ~ ", **kw)

    def visit_not_regexp_match_op_binary(self, binary: Any, operator: Any, **kw: Any) -> str:
        return self._generate_generic_binary(binary, " !~ ", **kw)


class MinkDDLCompiler(compiler.DDLCompiler):
    """``CREATE TABLE`` as mink takes it, with ``PARTITIONED BY`` and ``WITH`` from
    ``Table(..., mink_partitioned_by=[...], mink_with={"bucket.num": "4"})``."""

    def post_create_table(self, table: Any) -> str:
        options = table.dialect_options["mink"]
        text = ""
        partitioned_by = options.get("partitioned_by")
        if partitioned_by:
            names = ", ".join(self.preparer.quote(str(c)) for c in partitioned_by)
            text += f"\nPARTITIONED BY ({names})"
        with_options = options.get("with")
        if with_options:
            pairs = ", ".join(
                f"'{_escape(str(k))}' = '{_escape(str(v))}'" for k, v in with_options.items()
            )
            text += f"\nWITH ({pairs})"
        return text


def _escape(text: str) -> str:
    return text.replace("'", "''")


class MinkTypeCompiler(compiler.GenericTypeCompiler):
    """SQLAlchemy types as DataFusion's SQL names them."""

    def visit_DOUBLE(self, type_: Any, **kw: Any) -> str:
        return "DOUBLE"

    def visit_double(self, type_: Any, **kw: Any) -> str:
        return "DOUBLE"

    def visit_DOUBLE_PRECISION(self, type_: Any, **kw: Any) -> str:
        return "DOUBLE"

    def visit_FLOAT(self, type_: Any, **kw: Any) -> str:
        # DataFusion's FLOAT is 32 bits: a float of unstated or larger precision (a
        # Python float, pandas' float64) is a DOUBLE.
        precision = getattr(type_, "precision", None)
        return "REAL" if precision is not None and precision <= 24 else "DOUBLE"

    def visit_float(self, type_: Any, **kw: Any) -> str:
        return self.visit_FLOAT(type_, **kw)

    def visit_TINYINT(self, type_: Any, **kw: Any) -> str:
        return "TINYINT"

    def visit_TEXT(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"

    def visit_CLOB(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"

    def visit_NCHAR(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"

    def visit_NVARCHAR(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"

    def visit_BLOB(self, type_: Any, **kw: Any) -> str:
        return "BYTEA"

    def visit_BINARY(self, type_: Any, **kw: Any) -> str:
        return "BYTEA"

    def visit_VARBINARY(self, type_: Any, **kw: Any) -> str:
        return "BYTEA"

    def visit_large_binary(self, type_: Any, **kw: Any) -> str:
        return "BYTEA"

    def visit_datetime(self, type_: Any, **kw: Any) -> str:
        return "TIMESTAMP"

    def visit_DATETIME(self, type_: Any, **kw: Any) -> str:
        return "TIMESTAMP"

    def visit_TIMESTAMP(self, type_: Any, **kw: Any) -> str:
        return "TIMESTAMP WITH TIME ZONE" if getattr(type_, "timezone", False) else "TIMESTAMP"

    def visit_uuid(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"

    def visit_UUID(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"

    def visit_JSON(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"

    def visit_interval(self, type_: Any, **kw: Any) -> str:
        return "INTERVAL"

    def visit_ARRAY(self, type_: Any, **kw: Any) -> str:
        return self.process(type_.item_type, **kw) + "[]"


def _datetime_literal(value: Any) -> str:
    """A datetime as a TIMESTAMP literal; one with a zone becomes its UTC time."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, datetime.date):
        return f"TIMESTAMP '{value.isoformat()} 00:00:00'"
    return f"TIMESTAMP '{value}'"


class _DateTime(sqltypes.DateTime):
    def literal_processor(self, dialect: Any) -> Any:
        return _datetime_literal


class _Date(sqltypes.Date):
    def literal_processor(self, dialect: Any) -> Any:
        return lambda value: f"DATE '{value.isoformat() if hasattr(value, 'isoformat') else value}'"


class _Time(sqltypes.Time):
    def literal_processor(self, dialect: Any) -> Any:
        return lambda value: f"TIME '{value.isoformat() if hasattr(value, 'isoformat') else value}'"


# Flight SQL column metadata keys (arrow-flight's `sql::metadata`).
_FLIGHT_SCHEMA_NAME = b"ARROW:FLIGHT:SQL:DB_SCHEMA_NAME"
_FLIGHT_TABLE_NAME = b"ARROW:FLIGHT:SQL:TABLE_NAME"

# A statement that changes rows (comments and a WITH before it are not looked through).
_DML = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.I)


def _query_value(value: Any) -> Any:
    """A URL query value: the last of a repeated key."""
    if isinstance(value, (tuple, list)):
        return value[-1] if value else ""
    return value


def _status(error: BaseException) -> str:
    """The ADBC status of a driver error, as its name (``UNAUTHENTICATED``)."""
    code = getattr(error, "status_code", None)
    name = getattr(code, "name", None)
    if name:
        return str(name)
    text = str(error)
    return text.split(":", 1)[0] if ":" in text else ""


class MinkDialect(default.DefaultDialect):
    """mink's SQL (DataFusion's) over Flight SQL, through ADBC."""

    name = "mink"
    driver = "adbc"
    default_paramstyle = "qmark"

    statement_compiler = MinkCompiler
    ddl_compiler = MinkDDLCompiler
    type_compiler = MinkTypeCompiler
    preparer = MinkIdentifierPreparer

    supports_statement_cache = True
    supports_native_boolean = True
    supports_native_decimal = True
    supports_multivalues_insert = True
    supports_sane_rowcount = False
    supports_sane_multi_rowcount = False
    supports_alter = False
    supports_sequences = False
    supports_default_values = False
    supports_empty_insert = False
    supports_comments = False
    supports_server_side_cursors = False
    postfetch_lastrowid = False
    implicit_returning = False
    requires_name_normalize = False
    returns_unicode_strings = True
    description_encoding = None

    colspecs = {
        sqltypes.DateTime: _DateTime,
        sqltypes.Date: _Date,
        sqltypes.Time: _Time,
    }

    construct_arguments = [(sa_schema.Table, {"with": None, "partitioned_by": None})]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._target: Optional[Target] = None

    @classmethod
    def import_dbapi(cls) -> Any:
        import adbc_driver_flightsql.dbapi

        return adbc_driver_flightsql.dbapi

    if not SQLALCHEMY_2:

        @classmethod
        def dbapi(cls) -> Any:  # type: ignore[override]  # SQLAlchemy 1.4's name
            return cls.import_dbapi()

    # -- connecting ---------------------------------------------------------------------

    def create_connect_args(self, url: Any) -> Tuple[List[Any], Dict[str, Any]]:
        parts = (url.host, url.port, url.username, url.password, url.database)
        options = {key: _query_value(value) for key, value in dict(url.query).items()}
        try:
            self._target = Target.from_parts(*parts, options)
        except UrlError as error:
            raise exc.ArgumentError(str(error)) from error
        return [], {"mink_url": parts, "mink_options": options}

    def connect(self, *cargs: Any, **cparams: Any) -> Any:
        parts = cparams.pop("mink_url", (None, None, None, None, None))
        options = {**cparams.pop("mink_options", {}), **cparams}
        try:
            target = Target.from_parts(*parts, options)
        except UrlError as error:
            raise exc.ArgumentError(str(error)) from error
        self._target = target
        dbapi = self.dbapi
        connection = None
        try:
            connection = dbapi.connect(
                target.uri, db_kwargs=target.adbc_db_kwargs(), autocommit=True
            )
            # A first call (Flight SQL GetSqlInfo) now, so that a refused login or an
            # unreachable server fails here, saying so, not at the first statement.
            connection.adbc_get_info()
            return connection
        except dbapi.Error as error:
            if connection is not None:
                connection.close()
            raise self._connect_error(dbapi, target, error) from error

    @staticmethod
    def _connect_error(dbapi: Any, target: Target, error: Any) -> Any:
        """A refused login or an unreachable server as an OperationalError that says so
        (SQLAlchemy wraps it); other errors as they are."""
        status = _status(error)
        text = str(error)
        if status == "UNAUTHENTICATED":
            if target.username is None:
                why = "it requires a user and password: give them in the URL, " \
                      "mink://user:password@host:port"
            else:
                why = "wrong user or password"
            message = f"{target.describe()} refused the login: {why} ({text})"
        elif status in ("IO", "UNAVAILABLE") or "connection error" in text:
            message = f"cannot reach {target.describe()}: {text}"
        else:
            return error
        return dbapi.OperationalError(
            message,
            status_code=error.status_code,
            vendor_code=getattr(error, "vendor_code", None),
            sqlstate=getattr(error, "sqlstate", None),
        )

    def do_begin(self, dbapi_connection: Any) -> None:
        pass

    def do_commit(self, dbapi_connection: Any) -> None:
        # Autocommit: every statement is durable when it answers.
        pass

    def do_rollback(self, dbapi_connection: Any) -> None:
        # Nothing to roll back: mink has no transactions.
        pass

    def do_execute(self, cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        if not parameters:
            # An empty parameter tuple would make ADBC prepare and bind nothing.
            cursor.execute(statement)
        elif _DML.match(statement):
            # Flight SQL's update path, as one parameter row of executemany: ADBC then
            # answers the changed rows as the cursor's rowcount, which SQLAlchemy reads
            # after DML (the query path answers them as a result row).
            cursor.executemany(statement, [parameters])
        else:
            cursor.execute(statement, parameters)

    def do_execute_no_params(self, cursor: Any, statement: str, context: Any = None) -> None:
        cursor.execute(statement)

    def get_isolation_level(self, dbapi_connection: Any) -> str:
        return "AUTOCOMMIT"

    def get_default_isolation_level(self, dbapi_conn: Any) -> str:
        return "AUTOCOMMIT"

    def get_isolation_level_values(self, dbapi_conn: Any) -> List[str]:
        return ["AUTOCOMMIT"]

    def set_isolation_level(self, dbapi_connection: Any, level: str) -> None:
        if level != "AUTOCOMMIT":
            raise exc.ArgumentError(f"mink runs every statement in autocommit, not {level}")

    def _get_server_version_info(self, connection: Any) -> Tuple[int, ...]:
        info = _raw(connection).adbc_get_info()
        version = str(info.get("vendor_version") or "")
        return tuple(int(part) for part in re.findall(r"\d+", version)[:3])

    def _get_default_schema_name(self, connection: Any) -> str:
        return DEFAULT_SCHEMA

    def _check_unicode_returns(self, connection: Any, additional_tests: Any = None) -> bool:
        return True

    def _check_unicode_description(self, connection: Any) -> bool:
        return True

    # -- reflection -------------------------------------------------------------------

    def _rows(self, connection: Any, sql: str, params: Tuple[Any, ...] = ()) -> List[Any]:
        return list(connection.exec_driver_sql(sql, params).fetchall())

    @reflection.cache
    def get_schema_names(self, connection, **kw):
        rows = self._rows(
            connection,
            "SELECT schema_name FROM information_schema.schemata "
            "UNION SELECT table_schema FROM information_schema.tables",
        )
        return sorted({row[0] for row in rows} | {DEFAULT_SCHEMA})

    def _names(self, connection: Any, schema: Optional[str], table_type: str) -> List[str]:
        rows = self._rows(
            connection,
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = ? AND table_type = ? ORDER BY table_name",
            (schema or DEFAULT_SCHEMA, table_type),
        )
        return [row[0] for row in rows]

    @reflection.cache
    def get_table_names(self, connection, schema=None, **kw):
        return self._names(connection, schema, "BASE TABLE")

    @reflection.cache
    def get_view_names(self, connection, schema=None, **kw):
        return self._names(connection, schema, "VIEW")

    def has_table(
        self, connection: Any, table_name: str, schema: Optional[str] = None, **kw: Any
    ) -> bool:
        rows = self._rows(
            connection,
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = ? AND table_name = ?",
            (schema or DEFAULT_SCHEMA, table_name),
        )
        return bool(rows)

    def has_schema(self, connection: Any, schema_name: str, **kw: Any) -> bool:
        return schema_name in self.get_schema_names(connection, **kw)

    @reflection.cache
    def get_columns(self, connection, table_name, schema=None, **kw):
        schema = schema or DEFAULT_SCHEMA
        for source in (
            self._columns_from_flight_metadata,
            self._columns_from_information_schema,
            self._columns_from_result_schema,
        ):
            columns = source(connection, schema, table_name)
            if columns:
                return columns
        raise exc.NoSuchTableError(f"{schema}.{table_name}")

    def _columns_from_flight_metadata(
        self, connection: Any, schema: str, table: str
    ) -> Optional[List[Dict[str, Any]]]:
        """The columns of the table's schema as Flight SQL's ``GetTables`` sends it (ADBC's
        ``adbc_get_table_schema``): Arrow types and nullability, taken when every field's
        Flight SQL column metadata names this table; else None.

        ADBC passes the names as LIKE patterns (``log_t`` also matches ``logxt``), so only
        the metadata (``ARROW:FLIGHT:SQL:DB_SCHEMA_NAME`` and ``TABLE_NAME``) tells which
        table answered; a server that sends none is read through ``information_schema``.
        (``get_objects`` carries the type names too, but ADBC 1.13 leaves its nullability
        empty.)
        """
        try:
            arrow_schema = _raw(connection).adbc_get_table_schema(table, db_schema_filter=schema)
        except self.dbapi.Error:
            return None
        columns = []
        for field in arrow_schema:
            metadata = field.metadata or {}
            if (
                metadata.get(_FLIGHT_SCHEMA_NAME) != schema.encode()
                or metadata.get(_FLIGHT_TABLE_NAME) != table.encode()
            ):
                return None
            columns.append(_column(field.name, from_arrow(field.type), field.nullable))
        return columns or None

    def _columns_from_information_schema(
        self, connection: Any, schema: str, table: str
    ) -> Optional[List[Dict[str, Any]]]:
        rows = self._rows(
            connection,
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            (schema, table),
        )
        return [_column(name, from_type_name(data_type), nullable == "YES") for name, data_type, nullable in rows]

    def _columns_from_result_schema(
        self, connection: Any, schema: str, table: str
    ) -> Optional[List[Dict[str, Any]]]:
        """The columns of ``SELECT *`` from the table, from the schema Flight SQL's
        ``GetSchema`` answers (the statement does not run)."""
        quoted = f"{self.identifier_preparer.quote(schema)}.{self.identifier_preparer.quote(table)}"
        cursor = _raw(connection).cursor()
        try:
            arrow_schema = cursor.adbc_execute_schema(f"SELECT * FROM {quoted}")
        except self.dbapi.Error as error:
            if _status(error) == "NOT_FOUND":
                return None
            raise
        finally:
            cursor.close()
        return [_column(f.name, from_arrow(f.type), f.nullable) for f in arrow_schema]

    @reflection.cache
    def get_pk_constraint(self, connection, table_name, schema=None, **kw):
        schema = schema or DEFAULT_SCHEMA
        if self._target is None:
            util.warn("mink: no connection target known, primary keys not reflected")
            return {"constrained_columns": [], "name": None}
        try:
            columns = flight.primary_keys(self._target, CATALOG, schema, table_name)
        except flight.NotFound:
            # Not one of mink's tables (an information_schema view): no key.
            columns = []
        except Exception as error:  # noqa: BLE001 - reflection goes on without them
            util.warn(f"mink: GetPrimaryKeys of {schema}.{table_name} failed: {error}")
            columns = []
        return {"constrained_columns": columns, "name": None}

    def get_foreign_keys(self, connection: Any, table_name: str, schema: Optional[str] = None, **kw: Any) -> List[Any]:
        return []

    def get_indexes(self, connection: Any, table_name: str, schema: Optional[str] = None, **kw: Any) -> List[Any]:
        return []

    def get_unique_constraints(
        self, connection: Any, table_name: str, schema: Optional[str] = None, **kw: Any
    ) -> List[Any]:
        return []

    def get_check_constraints(
        self, connection: Any, table_name: str, schema: Optional[str] = None, **kw: Any
    ) -> List[Any]:
        return []

    def get_table_comment(
        self, connection: Any, table_name: str, schema: Optional[str] = None, **kw: Any
    ) -> Dict[str, Any]:
        return {"text": None}


def _raw(connection: Any) -> Any:
    """The ADBC connection under a SQLAlchemy connection (1.4 and 2.x)."""
    fairy = connection.connection
    if hasattr(fairy, "adbc_get_info"):
        return fairy  # SQLAlchemy 1.4's first connect hands the DBAPI connection itself
    return getattr(fairy, "dbapi_connection", None) or fairy.connection


def _column(name: str, type_: Any, nullable: bool) -> Dict[str, Any]:
    return {
        "name": name,
        "type": type_,
        "nullable": bool(nullable),
        "default": None,
        "autoincrement": False,
        "comment": None,
    }
