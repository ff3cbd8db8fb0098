"""mink's column types as SQLAlchemy types, and back.

mink describes a column's type in three ways, depending on where it is read:

* ``information_schema.columns.data_type`` and ``DESCRIBE`` print the Arrow type as
  DataFusion does: ``Int64``, ``Utf8``, ``Timestamp(µs, "UTC")``, ``Decimal128(10, 2)``;
* Flight SQL column metadata (``ARROW:FLIGHT:SQL:TYPE_NAME``, which ADBC's
  ``get_objects`` reports as ``xdbc_type_name``) may give an SQL name: ``BIGINT``,
  ``VARCHAR``, ``TIMESTAMP WITH TIME ZONE``, ``DECIMAL(10, 2)``;
* a result's or a table's Arrow schema gives a ``pyarrow.DataType``.

:func:`from_type_name` reads the first two, :func:`from_arrow` the third, and
:func:`sql_name` names an Arrow type as Superset's type matching expects (``BIGINT``,
``TIMESTAMP``, ...). Nothing here touches the network.

>>> from_type_name('Timestamp(µs, "UTC")')
TIMESTAMP(timezone=True)
>>> from_type_name("DECIMAL(10, 2)")
DECIMAL(precision=10, scale=2)
"""

from __future__ import annotations

import re
from typing import Any, List, Optional

from sqlalchemy import types as sqltypes

__all__ = ["DOUBLE", "TINYINT", "OpaqueType", "from_type_name", "from_arrow", "sql_name"]


if hasattr(sqltypes, "DOUBLE"):  # SQLAlchemy 2.0 and later
    DOUBLE = sqltypes.DOUBLE
else:  # SQLAlchemy 1.4

    class DOUBLE(sqltypes.Float):  # type: ignore[no-redef]
        """A 64-bit float (``DOUBLE``), which SQLAlchemy 1.4 does not name."""

        __visit_name__ = "DOUBLE"


class TINYINT(sqltypes.SmallInteger):
    """An 8-bit integer. Rendered as ``TINYINT`` in DDL; Superset sees ``SMALLINT``."""

    __visit_name__ = "TINYINT"


class OpaqueType(sqltypes.UserDefinedType):
    """A type SQLAlchemy has no class for (a struct, a map, a union): rendered by name,
    its values passed through as the driver returns them."""

    cache_ok = True

    def __init__(self, name: str) -> None:
        self.name = name

    def get_col_spec(self, **kw: Any) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"OpaqueType({self.name!r})"


_INTEGERS = {
    # Arrow names
    "int8": TINYINT,
    "int16": sqltypes.SMALLINT,
    "int32": sqltypes.INTEGER,
    "int64": sqltypes.BIGINT,
    "uint8": sqltypes.SMALLINT,
    "uint16": sqltypes.INTEGER,
    "uint32": sqltypes.BIGINT,
    "uint64": sqltypes.BIGINT,
    # SQL names
    "tinyint": TINYINT,
    "smallint": sqltypes.SMALLINT,
    "int2": sqltypes.SMALLINT,
    "int": sqltypes.INTEGER,
    "integer": sqltypes.INTEGER,
    "int4": sqltypes.INTEGER,
    "mediumint": sqltypes.INTEGER,
    "bigint": sqltypes.BIGINT,
    "long": sqltypes.BIGINT,
    "tinyint unsigned": sqltypes.SMALLINT,
    "smallint unsigned": sqltypes.INTEGER,
    "int unsigned": sqltypes.BIGINT,
    "integer unsigned": sqltypes.BIGINT,
    "bigint unsigned": sqltypes.BIGINT,
}

_SIMPLE = {
    "float16": sqltypes.REAL,
    "float32": sqltypes.REAL,
    "float64": DOUBLE,
    "real": sqltypes.REAL,
    "float": sqltypes.REAL,
    "float4": sqltypes.REAL,
    "double": DOUBLE,
    "double precision": DOUBLE,
    "float8": DOUBLE,
    "utf8": sqltypes.VARCHAR,
    "largeutf8": sqltypes.VARCHAR,
    "utf8view": sqltypes.VARCHAR,
    "string": sqltypes.VARCHAR,
    "varchar": sqltypes.VARCHAR,
    "char": sqltypes.VARCHAR,
    "character": sqltypes.VARCHAR,
    "character varying": sqltypes.VARCHAR,
    "nvarchar": sqltypes.VARCHAR,
    "text": sqltypes.VARCHAR,
    "binary": sqltypes.VARBINARY,
    "largebinary": sqltypes.VARBINARY,
    "binaryview": sqltypes.VARBINARY,
    "fixedsizebinary": sqltypes.VARBINARY,
    "varbinary": sqltypes.VARBINARY,
    "bytea": sqltypes.VARBINARY,
    "blob": sqltypes.VARBINARY,
    "boolean": sqltypes.BOOLEAN,
    "bool": sqltypes.BOOLEAN,
    "date32": sqltypes.DATE,
    "date64": sqltypes.DATE,
    "date": sqltypes.DATE,
    "time32": sqltypes.TIME,
    "time64": sqltypes.TIME,
    "time": sqltypes.TIME,
    "interval": sqltypes.Interval,
    "duration": sqltypes.Interval,
}

_TIMESTAMP_TZ_NAMES = {"timestamp with time zone", "timestamptz"}
_TIMESTAMP_NAMES = {"timestamp", "timestamp without time zone", "datetime"}
_DECIMAL_NAMES = {"decimal", "decimal32", "decimal64", "decimal128", "decimal256", "numeric"}
_LIST_NAMES = {"list", "largelist", "fixedsizelist", "listview", "largelistview"}

# A name, then optionally an argument list in parentheses: `Decimal128(10, 2)`,
# `Timestamp(µs, "UTC")`, `VARCHAR(20)`, `List(Int64)`, `TIMESTAMP(3) WITH TIME ZONE`.
_NAMED = re.compile(r"^([A-Za-z][A-Za-z0-9_ ]*)(?:\((.*)\)([A-Za-z ]*))?$", re.S)


def _split_arguments(text: str) -> List[str]:
    """Top-level comma-separated arguments of `text` (commas inside brackets or quotes
    do not split)."""
    parts, depth, quote, current = [], 0, None, []
    for char in text:
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "([<":
            depth += 1
        elif char in ")]>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if current or parts:
        parts.append("".join(current).strip())
    return parts


def _timestamp_has_zone(arguments: List[str]) -> bool:
    """Whether the arguments of an Arrow ``Timestamp(...)`` name a time zone.

    arrow-rs prints ``Timestamp(µs, "UTC")`` (and ``Timestamp(Microsecond, Some("UTC"))``
    before version 56); no zone is ``Timestamp(µs)`` or ``Timestamp(Microsecond, None)``.
    """
    if len(arguments) < 2:
        return False
    zone = arguments[1].strip()
    return zone not in ("", "None", "none", "null")


def from_type_name(name: Optional[str]) -> sqltypes.TypeEngine:
    """The SQLAlchemy type of a column whose type is printed as `name`, either the way
    DataFusion prints Arrow types (``information_schema.columns``) or as an SQL name
    (Flight SQL's type-name metadata). A name neither knows becomes an
    :class:`OpaqueType` of that name; an absent one, SQLAlchemy's ``NullType``."""
    if name is None or not name.strip():
        return sqltypes.NullType()
    text = name.strip()
    # SQL arrays: `BIGINT[]`.
    if text.endswith("[]"):
        return sqltypes.ARRAY(from_type_name(text[:-2]))
    match = _NAMED.match(text)
    if not match:
        return OpaqueType(text)
    base = " ".join(match.group(1).lower().split())
    arguments = _split_arguments(match.group(2)) if match.group(2) is not None else []
    suffix = " ".join((match.group(3) or "").lower().split())
    if suffix:
        base = f"{base} {suffix}"

    if base in _INTEGERS:
        return _INTEGERS[base]()
    if base in _TIMESTAMP_TZ_NAMES:
        return sqltypes.TIMESTAMP(timezone=True)
    if base in _TIMESTAMP_NAMES:
        # An Arrow timestamp names its zone in the arguments; an SQL one in the suffix.
        return sqltypes.TIMESTAMP(timezone=_timestamp_has_zone(arguments))
    if base in _DECIMAL_NAMES:
        numbers = [int(a) for a in arguments if a.strip().lstrip("-").isdigit()]
        if len(numbers) >= 2:
            return sqltypes.DECIMAL(precision=numbers[0], scale=numbers[1])
        if len(numbers) == 1:
            return sqltypes.DECIMAL(precision=numbers[0], scale=0)
        return sqltypes.DECIMAL()
    if base in ("varchar", "char", "character", "character varying", "nvarchar") and arguments:
        if arguments[0].isdigit():
            return sqltypes.VARCHAR(int(arguments[0]))
    if base in _SIMPLE:
        return _SIMPLE[base]()
    if base in _LIST_NAMES and arguments:
        return sqltypes.ARRAY(from_type_name(_list_item(arguments[0])))
    if base == "dictionary" and len(arguments) == 2:
        # Dictionary(Int32, Utf8): the values' type.
        return from_type_name(arguments[1])
    if base == "null":
        return sqltypes.NullType()
    return OpaqueType(text)


def _list_item(argument: str) -> str:
    """The item type of an Arrow list as arrow-rs prints it: ``Int64``,
    ``nullable Int64``, ``Field { name: "item", data_type: Int64, ... }``, or
    ``item: Int64``."""
    found = re.search(r"data_type:\s*([^,}]+(?:\([^)]*\))?)", argument)
    if found:
        return found.group(1).strip()
    argument = argument.strip()
    if argument.startswith("nullable "):
        argument = argument[len("nullable "):]
    if ":" in argument and not argument.startswith("Timestamp"):
        argument = argument.split(":", 1)[1]
    return argument.strip()


def from_arrow(data_type: Any) -> sqltypes.TypeEngine:
    """The SQLAlchemy type of a ``pyarrow.DataType``."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(data_type):
        return from_arrow(data_type.value_type)
    if t.is_int8(data_type):
        return TINYINT()
    if t.is_int16(data_type) or t.is_uint8(data_type):
        return sqltypes.SMALLINT()
    if t.is_int32(data_type) or t.is_uint16(data_type):
        return sqltypes.INTEGER()
    if t.is_integer(data_type):
        return sqltypes.BIGINT()
    if t.is_float16(data_type) or t.is_float32(data_type):
        return sqltypes.REAL()
    if t.is_float64(data_type):
        return DOUBLE()
    if t.is_decimal(data_type):
        return sqltypes.DECIMAL(precision=data_type.precision, scale=data_type.scale)
    if t.is_boolean(data_type):
        return sqltypes.BOOLEAN()
    if t.is_string(data_type) or t.is_large_string(data_type) or _is(t, "is_string_view", data_type):
        return sqltypes.VARCHAR()
    if (
        t.is_binary(data_type)
        or t.is_large_binary(data_type)
        or t.is_fixed_size_binary(data_type)
        or _is(t, "is_binary_view", data_type)
    ):
        return sqltypes.VARBINARY()
    if t.is_timestamp(data_type):
        return sqltypes.TIMESTAMP(timezone=data_type.tz is not None)
    if t.is_date(data_type):
        return sqltypes.DATE()
    if t.is_time(data_type):
        return sqltypes.TIME()
    if t.is_interval(data_type) or t.is_duration(data_type):
        return sqltypes.Interval()
    if t.is_list(data_type) or t.is_large_list(data_type) or t.is_fixed_size_list(data_type):
        return sqltypes.ARRAY(from_arrow(data_type.value_type))
    if t.is_null(data_type):
        return sqltypes.NullType()
    return OpaqueType(str(data_type))


def _is(types_module: Any, predicate: str, data_type: Any) -> bool:
    """`pyarrow.types.<predicate>(data_type)`, False where this pyarrow lacks it."""
    check = getattr(types_module, predicate, None)
    return bool(check and check(data_type))


def sql_name(data_type: Any) -> Optional[str]:
    """The SQL name of a ``pyarrow.DataType`` (a result column's type code in ADBC's
    ``cursor.description``), as Superset's type matching expects: ``BIGINT``,
    ``DOUBLE``, ``VARCHAR``, ``TIMESTAMP``, ``DATE``, ``BOOLEAN``, ``DECIMAL(10, 2)``.
    None for a value that is not a ``pyarrow.DataType``."""
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        return None
    if not isinstance(data_type, pa.DataType):
        return None
    sqla = from_arrow(data_type)
    if isinstance(sqla, OpaqueType):
        return sqla.name.upper()
    if isinstance(sqla, sqltypes.NullType):
        return "NULL"
    if isinstance(sqla, sqltypes.ARRAY):
        return "ARRAY"
    if isinstance(sqla, sqltypes.TIMESTAMP):
        return "TIMESTAMP WITH TIME ZONE" if sqla.timezone else "TIMESTAMP"
    if isinstance(sqla, sqltypes.DECIMAL):
        return f"DECIMAL({sqla.precision}, {sqla.scale})"
    if isinstance(sqla, sqltypes.Interval):
        return "INTERVAL"
    if isinstance(sqla, TINYINT):
        return "SMALLINT"
    return str(sqla.__visit_name__).upper()
