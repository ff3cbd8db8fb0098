"""Primary keys through Flight SQL's ``GetPrimaryKeys``.

mink's SQL shows no primary key (``information_schema`` has no constraint views and
``SHOW CREATE TABLE`` no definition), and ADBC's ``get_objects`` leaves
``table_constraints`` empty, but the Flight SQL endpoint answers ``GetPrimaryKeys``
(what JDBC's ``DatabaseMetaData.getPrimaryKeys`` calls). ADBC's DBAPI has no call for
it, so this module sends it with ``pyarrow.flight``: the command is a protobuf message
of three string fields inside a ``google.protobuf.Any``, encoded by hand (two fields
each; no protobuf package needed).

The Flight client, and the bearer token of its handshake, are kept per target and
renewed once when the server no longer knows the token (a restart forgets them).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

from .target import Target

__all__ = ["NotFound", "encode_get_primary_keys", "primary_keys"]

_TYPE_URL = "type.googleapis.com/arrow.flight.protocol.sql.CommandGetPrimaryKeys"


class NotFound(Exception):
    """The server knows no such table."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_get_primary_keys(catalog: Optional[str], schema: Optional[str], table: str) -> bytes:
    """``Any { type_url, value: CommandGetPrimaryKeys { catalog = 1, db_schema = 2,
    table = 3 } }`` as bytes, the command of a Flight descriptor.

    >>> encode_get_primary_keys(None, "d", "t")[-6:]
    b'\\x12\\x01d\\x1a\\x01t'
    """
    command = b""
    if catalog is not None:
        command += _bytes_field(1, catalog.encode())
    if schema is not None:
        command += _bytes_field(2, schema.encode())
    command += _bytes_field(3, table.encode())
    return _bytes_field(1, _TYPE_URL.encode()) + _bytes_field(2, command)


class _Client:
    """A Flight client of one target and its call options (the bearer token)."""

    def __init__(self, target: Target) -> None:
        import pyarrow.flight as flight

        self._flight = flight
        self.not_found = KeyError  # pyarrow raises ArrowKeyError for NOT_FOUND
        kwargs: Dict[str, Any] = {}
        if target.tls_root_certs:
            kwargs["tls_root_certs"] = target.tls_root_certs.encode()
        if target.tls_skip_verify:
            kwargs["disable_server_verification"] = True
        self._target = target
        self._client = flight.FlightClient(target.uri, **kwargs)
        self._options = self._login()

    def _login(self) -> Any:
        flight = self._flight
        if self._target.username is None:
            return flight.FlightCallOptions()
        header = self._client.authenticate_basic_token(
            self._target.username, self._target.password or ""
        )
        return flight.FlightCallOptions(headers=[header])

    def read(self, command: bytes) -> List[Dict[str, Any]]:
        flight = self._flight
        for attempt in (1, 2):
            try:
                descriptor = flight.FlightDescriptor.for_command(command)
                info = self._client.get_flight_info(descriptor, self._options)
                rows: List[Dict[str, Any]] = []
                for endpoint in info.endpoints:
                    reader = self._client.do_get(endpoint.ticket, self._options)
                    rows.extend(reader.read_all().to_pylist())
                return rows
            except flight.FlightUnauthenticatedError:
                if attempt == 2 or self._target.username is None:
                    raise
                self._options = self._login()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._client.close()


_clients: Dict[Target, _Client] = {}
_lock = threading.Lock()


def primary_keys(target: Target, catalog: Optional[str], schema: str, table: str) -> List[str]:
    """The primary-key columns of `schema.table`, in key order (empty for a table
    without one)."""
    command = encode_get_primary_keys(catalog, schema, table)
    with _lock:
        client = _clients.get(target)
        if client is None:
            client = _Client(target)
            _clients[target] = client
    try:
        rows = client.read(command)
    except client.not_found as error:
        raise NotFound(str(error)) from error
    except Exception:
        with _lock:
            if _clients.get(target) is client:
                del _clients[target]
        client.close()
        raise
    keyed: List[Tuple[int, str]] = [
        (row["key_sequence"], row["column_name"])
        for row in rows
        if row["table_name"] == table and row.get("db_schema_name") in (schema, None)
    ]
    return [name for _, name in sorted(keyed)]
