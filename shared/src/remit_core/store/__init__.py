"""Open a store from one URL.

* ``sqlite:///path/to/file.db`` -- the embedded default (WAL; many processes on one host);
  ``sqlite://`` alone is in-memory (one process).
* ``postgresql://user@host:5432/db`` -- psycopg 3 with a psycopg-pool pool
  (``pip install 'remit-core[postgres]'``); option ``schema=NAME`` puts remit's tables in
  that schema.
* ``redis://host:6379/0`` -- plain Redis >= 7, core commands and Lua only
  (``pip install 'remit-core[redis]'``); option ``prefix=NAME`` namespaces the keys,
  ``durability=none`` accepts a Redis that keeps nothing on disk.

Options common to all: ``lease=SECONDS`` (claim and in-flight effect lease).
"""

from __future__ import annotations

from typing import Any

from remit_core.errors import StoreConfigError
from remit_core.serde import Serde
from remit_core.store.base import DEFAULT_LEASE, Store, new_owner
from remit_core.urls import mask_url

SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
    "redis": "redis",
    "rediss": "redis",
}


def open_store(url: str, *, serde: Serde | None = None, lease: float | None = None,
               **options: Any) -> Store:
    """Open the store named by ``url`` (see the module docstring for the URL forms).

    Raises :class:`StoreConfigError` for an unknown scheme or a malformed URL,
    :class:`StoreUnavailable` when the server cannot be reached,
    :class:`StoreVersionError` for a store written by a newer remit, and
    :class:`ForeignSchemaError` when remit's tables exist but are not remit's.
    Every message names the URL with the password masked.
    """
    if not isinstance(url, str) or "://" not in url:
        raise StoreConfigError(
            f"not a store URL: {mask_url(str(url))!r}. Use sqlite:///path/to/file.db, "
            "postgresql://user@host/db or redis://host:6379/0.",
            url=mask_url(str(url)),
        )
    scheme = url.split("://", 1)[0].lower()
    scheme = scheme.split("+", 1)[0]
    kind = SCHEMES.get(scheme)
    if kind is None:
        close = [s for s in SCHEMES if s[:3] == scheme[:3]]
        hint = f" Did you mean {close[0]}://?" if close else ""
        raise StoreConfigError(
            f"unknown store scheme {scheme!r} in {mask_url(url)!r}.{hint} remit opens "
            "sqlite://, postgresql:// and redis:// URLs.",
            url=mask_url(url),
        )
    if kind == "sqlite":
        from remit_core.store.sqlite import SqliteStore

        return SqliteStore.open(url, serde=serde, lease=lease, **options)
    if kind == "postgres":
        try:
            from remit_core.store.postgres import PostgresStore
        except ImportError as exc:
            raise StoreConfigError(
                f"{mask_url(url)!r} needs psycopg 3: pip install 'remit-core[postgres]' ({exc})",
                url=mask_url(url),
            ) from exc
        return PostgresStore.open(url, serde=serde, lease=lease, **options)
    try:
        from remit_core.store.redis import RedisStore
    except ImportError as exc:
        raise StoreConfigError(
            f"{mask_url(url)!r} needs redis-py: pip install 'remit-core[redis]' ({exc})",
            url=mask_url(url),
        ) from exc
    return RedisStore.open(url, serde=serde, lease=lease, **options)


def parse_lease(value: str | None, url: str, default: float | None) -> float:
    if value is None:
        return DEFAULT_LEASE if default is None else default
    try:
        lease = float(value)
    except ValueError:
        lease = -1.0
    if lease <= 0:
        raise StoreConfigError(
            f"option lease={value!r} in {mask_url(url)!r} must be a positive number of seconds",
            url=mask_url(url),
        )
    return lease


__all__ = ["DEFAULT_LEASE", "Store", "new_owner", "open_store", "parse_lease"]
