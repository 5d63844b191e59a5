"""Bounded retries around store operations that are safe to repeat.

Every backend operation of :class:`~remit_core.store.Store` is atomic and
idempotent for its caller (see the store module), so it may be repeated after
a transient failure: a reset connection, a serialization failure or
``SQLITE_BUSY``. Retries are bounded; when they run out the last error is
raised as it was, or as :class:`StoreUnavailable` when the server could not be
reached at all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from remit_core import aio

log = logging.getLogger("remit")

T = TypeVar("T")

MAX_ATTEMPTS = int(os.environ.get("REMIT_RETRY_ATTEMPTS", "8"))
MAX_DELAY = float(os.environ.get("REMIT_RETRY_SECONDS", "30"))


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("remit: transient store error (%s: %s); retry %d",
                type(exc).__name__, exc, state.attempt_number)


def retrying(is_transient: Callable[[BaseException], bool], url: str) -> Retrying:
    """A tenacity policy: exponential back-off with jitter, bounded in attempts and time."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(MAX_ATTEMPTS) | stop_after_delay(MAX_DELAY),
        wait=wait_exponential(multiplier=0.05, max=2.0) + wait_random(0, 0.05),
        before_sleep=_log_retry,
        sleep=aio.sleep,  # under remit_core.aio.run: asyncio.sleep, the loop runs on
        reraise=True,
    )


def _held(exc: BaseException) -> bool:
    from remit_core.errors import ConsumeConflict

    return isinstance(exc, ConsumeConflict) and getattr(exc, "status", None) == "claimed"


def waiting_for_holder(limit: float, lease: float) -> Retrying:
    """A tenacity policy for a recovery that meets a held claim: try again while the
    claim is held (its holder may finish, or its lease run out), for at most ``limit``
    seconds, then raise the last :class:`~remit_core.ConsumeConflict`."""
    return Retrying(
        retry=retry_if_exception(_held),
        stop=stop_after_delay(limit),
        wait=wait_exponential(multiplier=0.05, max=max(0.05, min(1.0, lease / 4))),
        sleep=aio.sleep,
        reraise=True,
    )


def call_with_retries(is_transient: Callable[[BaseException], bool], url: str,
                      fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return retrying(is_transient, url)(fn, *args, **kwargs)
