"""Where a ``mink://`` URL points and how to log in there, as ADBC and Flight take it.

::

    mink://[user[:password]@]host[:port][?tls=true&tls_ca=/path/ca.pem]

The port defaults to 50051 (``mink server --sql-listen``), the host to 127.0.0.1.
Without ``tls`` the connection is plaintext, which mink serves on loopback only;
``tls=true`` (or a ``tls_ca``) speaks TLS, trusting the system's roots or the PEM file
``tls_ca`` names; ``tls_skip_verify=true`` skips the certificate check (tests only).
The same keys may come in SQLAlchemy's ``connect_args`` (``tls_ca`` as a path or
``tls_root_certs`` as the PEM text itself, the form Superset's "root certificate" field
takes). Nothing here touches the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

__all__ = ["DEFAULT_PORT", "Target", "UrlError"]

DEFAULT_PORT = 50051

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

# The keys a URL's query or connect_args may carry, and what each means.
KNOWN_KEYS = {
    "tls": "true to connect over TLS (default false: plaintext, loopback only)",
    "tls_ca": "path of the PEM certificate authority that signed the server's certificate",
    "tls_root_certs": "the PEM text of that authority (instead of a path)",
    "tls_skip_verify": "true to skip the certificate check (tests only)",
}

# ADBC Flight SQL database options (adbc_driver_flightsql.DatabaseOptions).
_TLS_ROOT_CERTS = "adbc.flight.sql.client_option.tls_root_certs"
_TLS_SKIP_VERIFY = "adbc.flight.sql.client_option.tls_skip_verify"


class UrlError(ValueError):
    """A ``mink://`` URL or connect argument mink's dialect cannot use."""


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise UrlError(f"mink: {key}={value!r} is not true or false")


@dataclass(frozen=True)
class Target:
    """A mink Flight SQL endpoint and the login to use there."""

    host: str
    port: int
    username: Optional[str] = None
    password: Optional[str] = None
    tls: bool = False
    tls_root_certs: Optional[str] = None
    tls_skip_verify: bool = False

    @classmethod
    def from_parts(
        cls,
        host: Optional[str],
        port: Optional[int],
        username: Optional[str],
        password: Optional[str],
        database: Optional[str],
        options: Mapping[str, Any],
    ) -> "Target":
        """A target from a URL's parts and its query (or connect_args) `options`."""
        if database not in (None, "", "default"):
            raise UrlError(
                f"mink: the URL names database {database!r}, but mink keeps no default "
                "database per connection: leave it out (mink://host:port) and name "
                "tables as database.table"
            )
        unknown = sorted(set(options) - set(KNOWN_KEYS))
        if unknown:
            known = "; ".join(f"{k}: {v}" for k, v in KNOWN_KEYS.items())
            raise UrlError(f"mink: unknown URL parameter(s) {', '.join(unknown)} (known: {known})")
        if password is not None and username is None:
            raise UrlError("mink: a password without a user")
        root_certs = options.get("tls_root_certs")
        ca_path = options.get("tls_ca")
        if ca_path:
            try:
                with open(str(ca_path), encoding="utf-8") as pem:
                    root_certs = pem.read()
            except OSError as error:
                raise UrlError(f"mink: cannot read tls_ca {ca_path!r}: {error}") from error
        skip_verify = _flag("tls_skip_verify", options.get("tls_skip_verify", False))
        tls = _flag("tls", options.get("tls", False)) or bool(root_certs) or skip_verify
        if port is not None and not 0 < int(port) < 65536:
            raise UrlError(f"mink: port {port} is out of range")
        return cls(
            host=host or "127.0.0.1",
            port=int(port) if port else DEFAULT_PORT,
            username=username or None,
            password=password if username else None,
            tls=tls,
            tls_root_certs=str(root_certs) if root_certs else None,
            tls_skip_verify=skip_verify,
        )

    @property
    def address(self) -> str:
        """``host:port``, with brackets around an IPv6 host."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def uri(self) -> str:
        """The ``grpc://`` or ``grpc+tls://`` URI that ADBC and Flight connect to."""
        scheme = "grpc+tls" if self.tls else "grpc"
        return f"{scheme}://{self.address}"

    def adbc_db_kwargs(self) -> Dict[str, str]:
        """The ADBC Flight SQL database options of this target."""
        options: Dict[str, str] = {}
        if self.username is not None:
            options["username"] = self.username
            options["password"] = self.password or ""
        if self.tls_root_certs:
            options[_TLS_ROOT_CERTS] = self.tls_root_certs
        if self.tls_skip_verify:
            options[_TLS_SKIP_VERIFY] = "true"
        return options

    def describe(self) -> str:
        """The target as an error message names it (never the password)."""
        who = f" as {self.username!r}" if self.username else ""
        return f"mink at {self.uri}{who}"
