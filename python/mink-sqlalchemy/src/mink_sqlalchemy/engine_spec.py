"""Apache Superset's engine spec for mink, registered through the
``superset.db_engine_specs`` entry point (Superset finds it once this package is
installed in its environment).

What it tells Superset:

* the engine (``mink``, the dialect's name) and the URI form it shows in the
  connection form;
* time grains for time-series charts, from ``date_trunc`` and ``date_bin``
  (:data:`mink_sqlalchemy.expressions.TIME_GRAIN_EXPRESSIONS`), and how to read epoch
  seconds or milliseconds as timestamps;
* how to write a datetime literal for a time-range filter;
* how limits are applied: Superset's default, a ``LIMIT n`` written into the statement
  (DataFusion takes it; ``LIMIT`` with a parameter it does not), and rows are fetched
  whole (mink streams them);
* the function list for SQL Lab's autocompletion, from ``information_schema.routines``;
* result column types: ADBC describes them as Arrow types, named here as SQL types so
  Superset sees which are temporal or numeric;
* a certificate pasted into the connection's "root certificate" field as the authority
  to trust over TLS;
* errors: a refused login, an unreachable server, an unknown table.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Dict, List, Optional

from flask_babel import gettext as __
from superset.db_engine_specs.base import BaseEngineSpec
from superset.errors import SupersetErrorType

from .expressions import (
    EPOCH_MS_TO_DTTM,
    EPOCH_TO_DTTM,
    FUNCTION_NAMES_SQL,
    TIME_GRAIN_EXPRESSIONS,
    datetime_literal,
)
from .types import sql_name

__all__ = ["MinkEngineSpec"]

_LOGIN_REFUSED = re.compile(r"refused the login: (?P<why>[^(]+?)\s*\(")
_UNREACHABLE = re.compile(r"cannot reach mink at (?P<uri>\S+)")
_NO_TABLE = re.compile(r"table '(?P<table>[^']+)' not found")


class MinkEngineSpec(BaseEngineSpec):
    """mink, through the ``mink://`` dialect (ADBC's Flight SQL driver)."""

    engine = "mink"
    engine_name = "mink"
    default_driver = "adbc"
    drivers = {"adbc": "ADBC Flight SQL driver"}
    sqlalchemy_uri_placeholder = "mink://user:password@host:50051[?tls=true]"

    _time_grain_expressions = TIME_GRAIN_EXPRESSIONS

    # CSV upload would write through pandas' to_sql, which creates a log table with
    # the file's columns; left off until a test covers it.
    supports_file_upload = False
    supports_dynamic_schema = False
    supports_catalog = False

    custom_errors = {
        _LOGIN_REFUSED: (
            __("mink refused the login: %(why)s"),
            SupersetErrorType.CONNECTION_ACCESS_DENIED_ERROR,
            {"invalid": ["username", "password"]},
        ),
        _UNREACHABLE: (
            __("Cannot reach mink at %(uri)s: is the server running and the port right?"),
            SupersetErrorType.CONNECTION_HOST_DOWN_ERROR,
            {"invalid": ["host", "port"]},
        ),
        _NO_TABLE: (
            __('The table "%(table)s" does not exist.'),
            SupersetErrorType.TABLE_DOES_NOT_EXIST_ERROR,
            {},
        ),
    }

    metadata = {
        "description": "mink: a streaming table store with a lake, queried with "
        "DataFusion's SQL over Arrow Flight SQL.",
        "categories": ["Analytical Databases", "Time Series Databases"],
        "pypi_packages": ["mink-sqlalchemy"],
        "connection_string": "mink://{username}:{password}@{host}:{port}",
        "default_port": 50051,
    }

    @classmethod
    def epoch_to_dttm(cls) -> str:
        return EPOCH_TO_DTTM

    @classmethod
    def epoch_ms_to_dttm(cls) -> str:
        return EPOCH_MS_TO_DTTM

    @classmethod
    def convert_dttm(
        cls, target_type: str, dttm: datetime, db_extra: Optional[Dict[str, Any]] = None
    ) -> Optional[str]:
        return datetime_literal(target_type, dttm)

    @classmethod
    def get_datatype(cls, type_code: Any) -> Optional[str]:
        return sql_name(type_code) or super().get_datatype(type_code)

    @classmethod
    def get_function_names(cls, database: Any) -> List[str]:
        frame = database.get_df(FUNCTION_NAMES_SQL)
        return [str(name) for name in frame[frame.columns[0]].tolist()]

    @staticmethod
    def get_extra_params(database: Any, source: Any = None) -> Dict[str, Any]:
        """The database's extra parameters; a root certificate given in the connection
        form becomes the dialect's ``tls_root_certs`` (and so TLS)."""
        extra: Dict[str, Any] = json.loads(database.extra or "{}")
        if database.server_cert:
            engine_params = extra.setdefault("engine_params", {})
            connect_args = engine_params.setdefault("connect_args", {})
            connect_args.setdefault("tls_root_certs", database.server_cert)
        return extra
