"""The SQL that mink's Superset engine spec writes, importable without Superset.

Superset groups a time-series chart by a *time grain*: an ISO 8601 duration (``PT1M``,
``P1D``, ...) it maps to an SQL expression over the temporal column, ``{col}`` standing
for the column. mink's SQL is DataFusion's: ``date_trunc`` truncates to a second,
minute, hour, day, week (Monday), month, quarter or year, and ``date_bin`` buckets by
any interval from the Unix epoch. Both keep the column's type (a zoned timestamp stays
zoned; a DATE becomes a TIMESTAMP).

>>> TIME_GRAIN_EXPRESSIONS["PT1M"].format(col="ts")
"date_trunc('minute', ts)"
>>> EPOCH_TO_DTTM.format(col="seconds")
'to_timestamp_seconds(seconds)'
>>> datetime_literal("TIMESTAMP", datetime.datetime(2024, 5, 1, 12, 30))
"TIMESTAMP '2024-05-01 12:30:00.000000'"
"""

from __future__ import annotations

import datetime
from typing import Dict, Optional

__all__ = [
    "EPOCH_MS_TO_DTTM",
    "EPOCH_TO_DTTM",
    "FUNCTION_NAMES_SQL",
    "TIME_GRAIN_EXPRESSIONS",
    "datetime_literal",
]


def _bin(interval: str) -> str:
    return f"date_bin(INTERVAL '{interval}', {{col}}, TIMESTAMP '1970-01-01 00:00:00')"


#: Superset's time grains (``superset.constants.TimeGrain`` values) as SQL over
#: ``{col}``. ``None`` is the column as it is.
TIME_GRAIN_EXPRESSIONS: Dict[Optional[str], str] = {
    None: "{col}",
    "PT1S": "date_trunc('second', {col})",
    "PT5S": _bin("5 seconds"),
    "PT30S": _bin("30 seconds"),
    "PT1M": "date_trunc('minute', {col})",
    "PT5M": _bin("5 minutes"),
    "PT10M": _bin("10 minutes"),
    "PT15M": _bin("15 minutes"),
    "PT30M": _bin("30 minutes"),
    "PT1H": "date_trunc('hour', {col})",
    "PT6H": _bin("6 hours"),
    "P1D": "date_trunc('day', {col})",
    "P1W": "date_trunc('week', {col})",
    "P1M": "date_trunc('month', {col})",
    "P3M": "date_trunc('quarter', {col})",
    "P1Y": "date_trunc('year', {col})",
    # Weeks starting on Sunday or Monday, and weeks ending on Saturday or Sunday (each
    # labelled by that day), from date_trunc's Monday weeks.
    "1969-12-28T00:00:00Z/P1W": "date_trunc('week', {col} + INTERVAL '1 day') - INTERVAL '1 day'",
    "1969-12-29T00:00:00Z/P1W": "date_trunc('week', {col})",
    "P1W/1970-01-03T00:00:00Z": "date_trunc('week', {col} + INTERVAL '1 day') + INTERVAL '5 days'",
    "P1W/1970-01-04T00:00:00Z": "date_trunc('week', {col}) + INTERVAL '6 days'",
}

#: Seconds since the Unix epoch (an integer column) as a timestamp.
EPOCH_TO_DTTM = "to_timestamp_seconds({col})"
#: Milliseconds since the Unix epoch as a timestamp.
EPOCH_MS_TO_DTTM = "to_timestamp_millis({col})"

#: The names of the functions mink's SQL knows (scalar, aggregate and window), for SQL
#: Lab's autocompletion.
FUNCTION_NAMES_SQL = (
    "SELECT DISTINCT routine_name FROM information_schema.routines ORDER BY routine_name"
)


def datetime_literal(target_type: str, dttm: datetime.datetime) -> Optional[str]:
    """A Python datetime as an SQL literal a column of `target_type` compares with
    (Superset's time-range filters), or None for a type mink has no literal for. A
    datetime with a zone is written as its UTC time; mink compares a zoned column with
    a zoneless literal as UTC."""
    kind = target_type.strip().upper()
    if dttm.tzinfo is not None:
        dttm = dttm.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    if kind.startswith("TIMESTAMP") or kind.startswith("DATETIME"):
        return f"TIMESTAMP '{dttm.isoformat(sep=' ', timespec='microseconds')}'"
    if kind.startswith("DATE"):
        return f"DATE '{dttm.date().isoformat()}'"
    return None
