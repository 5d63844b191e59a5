"""Open a store from one URL.

* ``sqlite:///path/to/file.db`` -- the embedded default (WAL; many processes on one host);
  ``sqlite://`` alone is in-memory (one process).
* ``postgresql://user@host:5432/db`` -- psycopg 3 with a psycopg-pool pool
  (``pip install 'remit-core[postgres]'``); option ``schema=NAME`` puts remit's tables in
  that schema.
* ``redis://host:6379/0`` -- plain Redis >= 7, core commands and Lua only
  (``pip install 'remit-core[redis]'``); option ``prefix=NAME`` namespaces the keys,
  ``durability=none`` accepts a Redis that keeps nothing on disk.

Options common to all: ``lease=SECONDS`` (claim and in-flight effect lease). Every
option, with its bounds, is in one table: :data:`remit_core.store.options.OPTIONS`.
"""

from __future__ import annotations

from typing import Any

from remit_core.errors import RemitError, StoreConfigError
from remit_core.serde import Serde
from remit_core.store.base import DEFAULT_LEASE, Store, new_owner
from remit_core.urls import leaks, mask_url, password_hint, scrub, url_secrets

SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
    "redis": "redis",
    "rediss": "redis",
}


def open_store(url: str, *, serde: Serde | None = None, lease: float | None = None,
               read_only: bool = False, **options: Any) -> Store:
    """Open the store named by ``url`` (see the module docstring for the URL forms).

    ``lease`` and ``options`` give defaults for the URL's options (the URL wins); every
    option is checked by one table (:mod:`remit_core.store.options`).

    ``read_only`` opens an existing store for reading only (``remit inspect``): it creates
    no file, table, schema or key, raises :class:`StoreNotFound` when the URL names no
    remit store, and refuses every write.

    Raises :class:`StoreConfigError` for an unknown scheme, a malformed URL or a bad
    option, :class:`StoreUnavailable` when the server cannot be reached,
    :class:`StoreVersionError` for a store written by a newer remit, and
    :class:`ForeignSchemaError` when remit's tables exist but are not remit's.
    No message, attribute or chained exception holds the URL's password.
    """
    secrets = url_secrets(str(url)) if isinstance(url, str) else []
    try:
        return _open(url, serde=serde, lease=lease, read_only=read_only, **options)
    except Exception as exc:
        clean = _without_secrets(exc, str(url), secrets)
        if clean is exc:
            raise
        raise clean from None


def _open(url: str, *, serde: Serde | None, lease: float | None, read_only: bool,
          **options: Any) -> Store:
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

        return SqliteStore.open(url, serde=serde, lease=lease, read_only=read_only, **options)
    if kind == "postgres":
        try:
            from remit_core.store.postgres import PostgresStore
        except ImportError as exc:
            raise StoreConfigError(
                f"{mask_url(url)!r} needs psycopg 3: pip install 'remit-core[postgres]' ({exc})",
                url=mask_url(url),
            ) from exc
        return PostgresStore.open(url, serde=serde, lease=lease, read_only=read_only,
                                  **options)
    try:
        from remit_core.store.redis import RedisStore
    except ImportError as exc:
        raise StoreConfigError(
            f"{mask_url(url)!r} needs redis-py: pip install 'remit-core[redis]' ({exc})",
            url=mask_url(url),
        ) from exc
    return RedisStore.open(url, serde=serde, lease=lease, read_only=read_only, **options)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception chained to it (as cause or context, shown or not)."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop()
        if any(cur is s for s in seen):
            continue
        seen.append(cur)
        todo += [e for e in (cur.__cause__, cur.__context__) if e is not None]
    return seen


def _without_secrets(exc: Exception, url: str, secrets: list[str]) -> Exception:
    """``exc`` as it may be shown: its message and attributes scrubbed, and a chained
    driver exception dropped when its text holds a secret. An exception that is not a
    :class:`RemitError` and whose text holds a secret becomes a :class:`StoreConfigError`."""
    hint = password_hint(url)
    if isinstance(exc, RemitError):
        exc.args = tuple(scrub(a, secrets) if isinstance(a, str) else a for a in exc.args)
        for key, value in list(vars(exc).items()):
            if isinstance(value, str):
                setattr(exc, key, scrub(value, secrets))
        if hint and exc.args and isinstance(exc.args[0], str) and hint not in exc.args[0]:
            exc.args = (exc.args[0] + hint, *exc.args[1:])
        if any(leaks(str(e), secrets) or leaks(repr(e), secrets) for e in _chain(exc)[1:]):
            exc.__cause__ = exc.__context__ = None
            exc.__suppress_context__ = True
        return exc
    if secrets and any(leaks(str(e), secrets) or leaks(repr(e), secrets)
                       for e in _chain(exc)):
        return StoreConfigError(
            f"cannot open {mask_url(url)!r}: {type(exc).__name__}: "
            f"{scrub(str(exc), secrets)}.{hint}",
            url=mask_url(url),
        )
    return exc


__all__ = ["DEFAULT_LEASE", "Store", "new_owner", "open_store"]
