"""Store URL options: one typed table, parsed and bounded here for every backend.

Each :class:`Option` says which backends take it, its type and bounds (a pydantic type),
the allowed values in words (for the error message), its default and what it does.
:func:`parse_options` is the one place that reads a URL's query string and the keyword
options of :func:`~remit_core.open_store`:

* a value from the URL wins over a keyword, a keyword over the default;
* a bad value is a :class:`StoreConfigError` naming the option, the value and what is
  allowed; nothing has been opened or created yet;
* an unknown option is a :class:`StoreConfigError` listing the known ones (remit's, and
  the connection parameters of the backend's driver, which are passed on to it).

A driver option that is in the table (``connect_timeout``, ``socket_timeout`` ...) is
bounded here and then passed on as given.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError

from remit_core.errors import StoreConfigError

Backend = Literal["sqlite", "postgres", "redis"]
ALL: frozenset[str] = frozenset({"sqlite", "postgres", "redis"})

DAY = 86400.0
HOUR = 3600.0

_ADAPTERS: dict[tuple[str, frozenset[str]], TypeAdapter[Any]] = {}

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _seconds(*, gt: float | None = None, ge: float | None = None, le: float) -> Any:
    return Annotated[float, Field(gt=gt, ge=ge, le=le, allow_inf_nan=False)]


def _integer(*, ge: int, le: int) -> Any:
    return Annotated[int, Field(ge=ge, le=le)]


def _choice(*values: str) -> Any:
    def pick(v: object) -> str:
        text = str(v).strip()
        for value in values:
            if text.lower() == value.lower():
                return value
        raise ValueError(f"not one of {', '.join(values)}")

    return Annotated[str, BeforeValidator(pick)]


def _file_mode(v: object) -> int:
    if isinstance(v, bool):
        raise ValueError("not a file mode")
    if isinstance(v, int):
        mode = v
    else:
        text = str(v).strip().lower().removeprefix("0o")
        if not re.fullmatch(r"[0-7]{3,4}", text):
            raise ValueError("not an octal file mode")
        mode = int(text, 8)
    if not 0 <= mode <= 0o777:
        raise ValueError("not a file mode (octal, at most 0777)")
    if mode & 0o600 != 0o600:
        raise ValueError("the owner needs read and write")
    return mode


def _schema(name: str) -> str:
    if not _SCHEMA_NAME.fullmatch(name):
        raise ValueError("not a plain schema name")
    if name.lower().startswith("pg_") or name.lower() == "information_schema":
        raise ValueError("a schema reserved by PostgreSQL")
    return name


def _prefix(name: str) -> str:
    if not name or any(c.isspace() for c in name):
        raise ValueError("empty, or holds white space")
    return name


@dataclass(frozen=True)
class Option:
    """One URL option: who takes it, its type and bounds, and what it does."""

    name: str
    backends: frozenset[str]
    type: Any
    #: the allowed values in words, as the error message says them
    allowed: str
    default: Any
    doc: str
    #: a connection parameter of the driver: bounded here, then passed on as given
    driver: bool = False

    @property
    def adapter(self) -> TypeAdapter[Any]:
        key = (self.name, self.backends)
        found = _ADAPTERS.get(key)
        if found is None:
            found = _ADAPTERS[key] = TypeAdapter(self.type)
        return found

    def parse(self, value: object, where: str, *, url: str | None) -> Any:
        try:
            return self.adapter.validate_python(value)
        except ValidationError:
            shown = repr(value) if isinstance(value, str) else _text(value)
            raise StoreConfigError(
                f"option {self.name}={shown} in {where} is not allowed: {self.name} must "
                f"be {self.allowed}.",
                url=url,
            ) from None


def _text(value: object) -> str:
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return str(value)


OPTIONS: tuple[Option, ...] = (
    Option("lease", ALL, _seconds(gt=0, le=DAY), "a number of seconds, 0 < lease <= 86400",
           30.0, "how long a claim or an in-flight effect stays owned without a heartbeat"),
    Option("wait", ALL, _seconds(ge=0, le=DAY), "a number of seconds, 0 <= wait <= 86400",
           0.0, "how long a recovery (a resume that delivers no new value) waits for a "
           "claim whose holder has not finished -- for it to finish, or for its lease to run "
           "out and be taken over -- before it raises ConsumeConflict; 0 raises at once"),
    # SQLite
    Option("timeout", frozenset({"sqlite"}), _seconds(ge=0, le=HOUR),
           "a number of seconds, 0 <= timeout <= 3600", 30.0,
           "how long to wait for another process's write lock (busy timeout)"),
    Option("synchronous", frozenset({"sqlite"}), _choice("FULL", "NORMAL", "EXTRA"),
           "FULL, NORMAL or EXTRA", "FULL", "SQLite's PRAGMA synchronous"),
    Option("mode", frozenset({"sqlite"}), Annotated[int, BeforeValidator(_file_mode)],
           "an octal file mode that gives the owner read and write, 0600 to 0777 "
           "(for example mode=0640)", 0o600,
           "the permissions of the database and its -wal and -shm files, when remit "
           "creates the database"),
    # PostgreSQL
    Option("schema", frozenset({"postgres"}), Annotated[str, AfterValidator(_schema)],
           "1-63 letters, digits and underscores, starting with a letter or underscore, "
           "not a schema reserved by PostgreSQL (pg_*, information_schema); for example "
           "schema=remit", "public", "the schema that holds remit's tables"),
    Option("pool_min", frozenset({"postgres"}), _integer(ge=0, le=1000),
           "an integer, 0 <= pool_min <= 1000 (and at most pool_max)", 1,
           "connections the pool keeps open"),
    Option("pool_max", frozenset({"postgres"}), _integer(ge=1, le=1000),
           "an integer, 1 <= pool_max <= 1000 (and at least pool_min)", 10,
           "connections the pool opens at most"),
    Option("pool_timeout", frozenset({"postgres"}), _seconds(gt=0, le=HOUR),
           "a number of seconds, 0 < pool_timeout <= 3600", 10.0,
           "how long to wait for a free pooled connection"),
    Option("connect_timeout", frozenset({"postgres"}), _integer(ge=1, le=int(HOUR)),
           "an integer number of seconds, 1 <= connect_timeout <= 3600", 5,
           "libpq's connect timeout (remit's default is 5)", driver=True),
    # Redis
    Option("prefix", frozenset({"redis"}), Annotated[str, AfterValidator(_prefix)],
           "a non-empty name without white space (for example prefix=remit)", "remit",
           "the namespace of remit's keys"),
    Option("durability", frozenset({"redis"}), _choice("none", "required"),
           "'none' (accept a Redis that keeps nothing on disk) or 'required'",
           "required", "whether to refuse a Redis without AOF or RDB"),
    Option("socket_timeout", frozenset({"redis"}), _seconds(gt=0, le=HOUR),
           "a number of seconds, 0 < socket_timeout <= 3600", None,
           "redis-py's socket timeout", driver=True),
    Option("timeout", frozenset({"redis"}), _seconds(gt=0, le=HOUR),
           "a number of seconds, 0 < timeout <= 3600", None,
           "redis-py's socket timeout (alias of socket_timeout)", driver=True),
    Option("socket_connect_timeout", frozenset({"redis"}), _seconds(gt=0, le=HOUR),
           "a number of seconds, 0 < socket_connect_timeout <= 3600", 5.0,
           "redis-py's connect timeout (remit's default is 5)", driver=True),
    Option("health_check_interval", frozenset({"redis"}), _seconds(ge=0, le=DAY),
           "a number of seconds, 0 <= health_check_interval <= 86400", None,
           "redis-py's idle-connection health check", driver=True),
    Option("max_connections", frozenset({"redis"}), _integer(ge=1, le=100_000),
           "an integer, 1 <= max_connections <= 100000", None,
           "redis-py's pool size", driver=True),
    Option("db", frozenset({"redis"}), _integer(ge=0, le=2**31 - 1),
           "an integer database number, 0 or more", None,
           "the Redis database (also the URL's path, /0)", driver=True),
    Option("socket_read_size", frozenset({"redis"}), _integer(ge=1, le=2**31 - 1),
           "an integer number of bytes, 1 or more", None,
           "redis-py's read buffer", driver=True),
    Option("protocol", frozenset({"redis"}), Annotated[int, Field(ge=2, le=3)],
           "2 or 3", None, "the RESP protocol version", driver=True),
)

_BY_KEY: dict[tuple[str, str], Option] = {
    (backend, o.name): o for o in OPTIONS for backend in sorted(o.backends)}


def option(backend: str, name: str) -> Option | None:
    return _BY_KEY.get((backend, name))


def known_options(backend: str) -> list[str]:
    """remit's own options of ``backend`` (driver parameters not included), in table order."""
    return [o.name for o in OPTIONS if backend in o.backends and not o.driver]


# --------------------------------------------------------------------------- driver parameters

#: redis-py connection parameters that take a string from a URL (as redis-py reads them)
_REDIS_STRING_PARAMS = ("client_name", "username", "password", "lib_name", "lib_version",
                        "socket_keepalive", "retry_on_timeout", "ssl_check_hostname")
_REDIS_SSL_PARAMS = ("ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs",
                     "ssl_ca_path", "ssl_password", "ssl_ciphers", "ssl_min_version")


@cache
def _redis_params(ssl: bool) -> tuple[str, ...]:
    import redis.connection as rc

    accepted: set[str] = set()
    classes: list[Any] = [rc.AbstractConnection, rc.Connection]
    if ssl:
        classes.append(rc.SSLConnection)
    for cls in classes:
        accepted |= set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    parsed = set(getattr(rc, "URL_QUERY_ARGUMENT_PARSERS", {}))
    wanted = set(_REDIS_STRING_PARAMS) | (set(_REDIS_SSL_PARAMS) if ssl else set())
    return tuple(sorted((parsed | (wanted & accepted)) - {"retry_on_error"}))


@cache
def _libpq_params() -> tuple[str, ...]:
    from psycopg.pq import Conninfo

    return tuple(sorted(o.keyword.decode() for o in Conninfo.get_defaults()))


def driver_params(backend: str, scheme: str) -> tuple[str, ...]:
    """The driver's connection parameters that a URL may carry (passed on unchanged)."""
    if backend == "postgres":
        return _libpq_params()
    if backend == "redis":
        return _redis_params(scheme == "rediss")
    return ()


# ------------------------------------------------------------------------------------ parsing


@dataclass(frozen=True)
class Parsed:
    """What :func:`parse_options` returns."""

    #: remit's options, every one of the backend with its value (or default)
    values: dict[str, Any]
    #: the driver's query parameters, as given (those in the table were bounded)
    driver_query: list[tuple[str, str]]
    #: keyword options for the driver (after the table's checks)
    driver_kwargs: dict[str, Any]
    #: remit's options that the URL or a keyword gave (the others have their default)
    given: frozenset[str] = frozenset()


def parse_options(backend: str, query: str, overrides: Mapping[str, Any], *, scheme: str,
                  where: str, url: str | None,
                  extra_check: Callable[[dict[str, Any]], None] | None = None,
                  keyword_passthrough: bool = True) -> Parsed:
    """Parse a URL's query string and the keyword options for ``backend``.

    ``where`` names the URL (masked) in messages and ``url`` is the ``url`` attribute of
    the errors. Keyword options that are not in the table go to the driver when
    ``keyword_passthrough``, else they are unknown options.
    """
    drivers = driver_params(backend, scheme)
    pairs = parse_qsl(query, keep_blank_values=True)
    unknown = [k for k, _ in pairs if option(backend, k) is None and k not in drivers]
    seen: dict[str, str] = {}
    for k, v in pairs:
        if k in seen and option(backend, k) is not None:
            raise StoreConfigError(f"option {k} is given twice in {where}; give it once.",
                                   url=url)
        seen[k] = v
    if not keyword_passthrough:
        unknown += [k for k in overrides if option(backend, k) is None]
    if unknown:
        raise StoreConfigError(_unknown_message(backend, unknown, drivers, where), url=url)
    values: dict[str, Any] = {}
    driver_query: list[tuple[str, str]] = []
    for k, v in pairs:
        opt = option(backend, k)
        if opt is not None:
            parsed = opt.parse(v, where, url=url)
            if opt.driver:
                driver_query.append((k, v))
            else:
                values[k] = parsed
        else:
            driver_query.append((k, v))
    driver_kwargs: dict[str, Any] = {}
    for k, v in overrides.items():
        opt = option(backend, k)
        if opt is None:
            driver_kwargs[k] = v
        elif v is None:
            continue
        elif opt.driver:
            driver_kwargs[k] = opt.parse(v, f"the keyword options for {where}", url=url)
        elif k not in values:
            values[k] = opt.parse(v, f"the keyword options for {where}", url=url)
    given = frozenset(values)
    for opt in OPTIONS:
        if backend in opt.backends and not opt.driver:
            values.setdefault(opt.name, opt.default)
    if extra_check is not None:
        extra_check(values)
    return Parsed(values, driver_query, driver_kwargs, given)


def _unknown_message(backend: str, unknown: Sequence[str], drivers: Sequence[str],
                     where: str) -> str:
    ours = known_options(backend)
    ours += [o.name for o in OPTIONS if backend in o.backends and o.driver
             and o.name not in drivers]
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, [*ours, *drivers], n=1)
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    text = (f"unknown option(s) {', '.join(unknown)} in {where}"
            + (f" ({'; '.join(hints)})" if hints else "")
            + f"; {backend} URLs take remit's options {', '.join(ours)}")
    if drivers:
        who = "libpq's" if backend == "postgres" else "redis-py's"
        text += f", and {who} connection parameters {', '.join(drivers)}"
    return text + "."


__all__ = ["OPTIONS", "Option", "Parsed", "driver_params", "known_options", "option",
           "parse_options"]
