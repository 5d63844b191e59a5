"""Redis-only tests: durability refusal, version and foreign keys, key escaping, restarts.

The contract itself is checked by tests/test_store.py on every backend; this file
covers what only the Redis backend has. Tests that restart a server start their own
redis-server (AOF, appendfsync always) on a free port in tmp_path; the shared Redis at
127.0.0.1:6379 is only used to check that it is refused (it keeps nothing on disk).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
from redis import exceptions as rx

from remit_core import ConsumeConflict, open_store
from remit_core.errors import (
    DurabilityError,
    ForeignSchemaError,
    StoreConfigError,
    StoreUnavailable,
    StoreVersionError,
)
from remit_core.store import Store, new_owner
from remit_core.store.redis import MIGRATIONS, RedisStore
from tests.conftest import REDIS_SHARED, free_port, unavailable, wait_for_port

pytestmark = pytest.mark.redis


def prefix_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["prefix"][0]


@pytest.fixture
def url(make_url: Callable[[str], str]) -> str:
    return make_url("redis")


@pytest.fixture
def raw(redis_server: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server)
    yield client
    client.close()


@pytest.fixture
def rstore(url: str) -> Iterator[Store]:
    s = open_store(url, lease=2.0)
    yield s
    s.close()


class PrivateRedis:
    """A redis-server of this test (AOF, appendfsync always) that it may kill and restart."""

    def __init__(self, directory: Path, *extra: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis-server is not installed")
        self.binary = str(binary)
        self.dir = directory
        self.port = free_port()
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--daemonize", "no", "--logfile", str(self.dir / "redis.log"), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if not wait_for_port(self.port):
            raise AssertionError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, so only what the AOF already holds survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


# ----------------------------------------------------------------------------- durability


def test_shared_non_durable_redis_is_refused() -> None:
    client = redis.Redis.from_url(REDIS_SHARED, socket_connect_timeout=3)
    try:
        client.ping()
        config = {**client.config_get("appendonly"), **client.config_get("save")}
    except redis.RedisError as exc:
        unavailable(f"shared Redis at {REDIS_SHARED} is unreachable: {exc}")
    if config.get("appendonly") != "no" or config.get("save"):
        pytest.skip(f"the shared Redis at {REDIS_SHARED} persists its data ({config})")
    prefix = f"remit-t-{uuid.uuid4().hex[:12]}"
    try:
        with pytest.raises(DurabilityError) as info:
            open_store(f"{REDIS_SHARED}?prefix={prefix}")
        msg = str(info.value)
        assert "appendonly yes" in msg and "durability=none" in msg
        assert REDIS_SHARED in msg
        assert client.exists(f"{prefix}:meta") == 0  # refused before writing anything

        with open_store(f"{REDIS_SHARED}?prefix={prefix}&durability=none") as s:
            s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
            got = s.get_checkpoint("r")
            assert got is not None and got.values == {"x": 1}
    finally:
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()


def test_config_unavailable_falls_back_to_info(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    # a managed Redis may rename CONFIG away; then INFO persistence decides, else a warning
    (tmp_path / "aof").mkdir()
    (tmp_path / "none").mkdir()
    with_aof = PrivateRedis(tmp_path / "aof", "--rename-command", "CONFIG", "")
    without = PrivateRedis(tmp_path / "none", "--rename-command", "CONFIG", "",
                           "--appendonly", "no")
    with_aof.start()
    without.start()
    try:
        with caplog.at_level(logging.WARNING, logger="remit"):
            with open_store(f"{with_aof.url}?prefix=p") as s:
                s.put_checkpoint("r", "c1")
            assert not [r for r in caplog.records if "cannot verify" in r.message]
            with open_store(f"{without.url}?prefix=p") as s:
                s.put_checkpoint("r", "c1")
            assert [r for r in caplog.records if "cannot verify" in r.message]
    finally:
        with_aof.kill()
        without.kill()


def test_unreachable_server_masks_password() -> None:
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        open_store("redis://:secret@127.0.0.1:1/0?prefix=p")
    assert time.monotonic() - began < 10
    msg = str(info.value)
    assert "secret" not in msg and "***" in msg
    assert info.value.url is not None and "secret" not in info.value.url
    with pytest.raises(StoreUnavailable) as info2:
        open_store("redis://someone:secret@127.0.0.1:1/0")
    assert "secret" not in str(info2.value) and "someone:***@" in str(info2.value)


def test_url_options(url: str, redis_server: str) -> None:
    with open_store(f"{url}&lease=7&socket_timeout=10&health_check_interval=5") as s:
        assert isinstance(s, RedisStore)
        assert s.lease == 7.0 and s.prefix == prefix_of(url)
        s.put_checkpoint("r", "c1")
    with pytest.raises(StoreConfigError, match="durability"):
        open_store(f"{url}&durability=maybe")
    with pytest.raises(StoreConfigError, match="prefix"):
        open_store(f"{redis_server}?prefix=")
    with pytest.raises(StoreConfigError, match="lease"):
        open_store(f"{url}&lease=-1")


def test_prefixes_are_isolated(redis_server: str) -> None:
    a, b = (f"{redis_server}?prefix=remit-t-{uuid.uuid4().hex[:12]}" for _ in range(2))
    with open_store(a) as sa, open_store(b) as sb:
        sa.put_checkpoint("r", "c1", data="a")
        sb.put_checkpoint("r", "c1", data="b")
        assert sa.get_checkpoint("r").data == "a"  # type: ignore[union-attr]
        assert sb.get_checkpoint("r").data == "b"  # type: ignore[union-attr]
        sa.delete_run("r")
        assert sb.get_checkpoint("r") is not None
        assert sa.usage() == {k: 0 for k in sa.usage()}


# ------------------------------------------------------------------ version and foreign keys


def test_newer_layout_is_refused_and_kept(url: str, raw: redis.Redis) -> None:
    p = prefix_of(url)
    with open_store(url) as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
    assert raw.hgetall(f"{p}:meta") == {b"schema": b"remit",
                                        b"version": str(len(MIGRATIONS)).encode()}
    raw.hset(f"{p}:meta", "version", len(MIGRATIONS) + 1)
    with pytest.raises(StoreVersionError) as info:
        open_store(url)
    assert info.value.found == len(MIGRATIONS) + 1 and info.value.supported == len(MIGRATIONS)
    assert "Upgrade remit-core" in str(info.value)
    assert raw.hget(f"{p}:meta", "version") == str(len(MIGRATIONS) + 1).encode()
    raw.hset(f"{p}:meta", "version", len(MIGRATIONS))  # the data was left intact
    with open_store(url) as s:
        got = s.get_checkpoint("r")
        assert got is not None and got.values == {"x": 1}


def test_an_upgrade_indexes_the_claims_held_before_it(url: str, raw: redis.Redis) -> None:
    """A store of the layout before the index of held claims (P:clh): opening it
    writable indexes the claims it holds, so a recovery lists the ones that lapsed;
    consumed and released claims are not indexed."""
    p = prefix_of(url)
    with open_store(url) as s:
        for run in ("held", "consumed", "released"):
            s.start_run(run, framework="fw", name="g", owner="w")
            assert s.end_run(run, owner="w", fence=1, status="parked")
            s.claim_once(f"{run}:k", run_id=run, owner="o", digest="d", lease=0.0)
        s.consume_claim("consumed:k", owner="o", fence=1)
        assert s.release_claim("released:k", owner="o", fence=1)
    raw.delete(f"{p}:clh")  # as a store of the layout before had it: no such index
    raw.hset(f"{p}:meta", "version", len(MIGRATIONS) - 1)
    with open_store(url) as s:
        assert raw.hget(f"{p}:meta", "version") == str(len(MIGRATIONS)).encode()
        assert raw.zrange(f"{p}:clh", 0, -1) == [b"held:k"]
        assert [c.key for c in s.list_lapsed_claims(framework="fw")] == ["held:k"]


@pytest.mark.parametrize("case", ["seq-without-meta", "meta-is-a-list", "meta-of-another-schema",
                                  "runs-is-a-list", "known-is-a-string"])
def test_foreign_keys_are_refused_and_untouched(case: str, url: str, raw: redis.Redis) -> None:
    p = prefix_of(url)
    if case == "seq-without-meta":
        raw.set(f"{p}:seq", "42")
        name = f"{p}:seq"
    elif case == "meta-is-a-list":
        raw.rpush(f"{p}:meta", "theirs")
        name = f"{p}:meta"
    elif case == "meta-of-another-schema":
        raw.hset(f"{p}:meta", mapping={"schema": "other", "version": "1"})
        name = f"{p}:meta"
    elif case == "runs-is-a-list":
        open_store(url).close()  # a remit store, then a foreign key of the wrong type
        raw.rpush(f"{p}:runs", "theirs")
        name = f"{p}:runs"
    else:
        raw.set(f"{p}:known", "theirs")
        name = f"{p}:known"
    before = {k: (raw.type(k), raw.dump(k)) for k in raw.scan_iter(match=f"{p}:*")}
    with pytest.raises(ForeignSchemaError) as info:
        open_store(url)
    assert info.value.name == name and name in str(info.value)
    assert "untouched" in str(info.value)
    after = {k: (raw.type(k), raw.dump(k)) for k in raw.scan_iter(match=f"{p}:*")}
    assert after == before


# --------------------------------------------------------------------------------- key layout


def test_key_components_never_collide(rstore: Store) -> None:
    # naive joins would map these pairs onto the same keys
    pairs = [("a:b", "c"), ("a", "b:c"), ("a%3Ab", "c"), ("a%b", "c"), ("a", "b%3Ac")]
    for i, (run, ns) in enumerate(pairs):
        rstore.put_checkpoint(run, "x:y", ns=ns, data=i, new_values={"ch:1": ("v:1", i)})
        rstore.put_writes(run, "x:y", "t:1", [(0, "ch:1", i)], ns=ns)
        rstore.claim_once(repr((run, ns)), run_id=run, owner=new_owner())
    for i, (run, ns) in enumerate(pairs):
        got = rstore.get_checkpoint(run, ns=ns)
        assert got is not None and got.data == i and got.values == {"ch:1": i}
        assert [(w.task_id, w.value) for w in got.writes] == [("t:1", i)]
    rstore.delete_run("a:b")
    assert rstore.get_checkpoint("a:b", ns="c") is None
    assert rstore.get_checkpoint("a", ns="b:c") is not None
    assert rstore.get_checkpoint("a%3Ab", ns="c") is not None
    assert [c.key for c in rstore.list_claims("a:b")] == []
    assert len(rstore.list_claims()) == len(pairs) - 1
    assert rstore.usage("a%3Ab")["checkpoints"] == 1


def test_deleting_everything_leaves_only_meta_and_seq(url: str, rstore: Store,
                                                      raw: redis.Redis) -> None:
    p = prefix_of(url)
    for run in ("r", "s:1"):
        rstore.put_checkpoint(run, "c0", execution_id="e0", new_values={"x": ("1", 0)})
        rstore.put_checkpoint(run, "c1", parent_id="c0", execution_id="e1",
                              new_values={"x": ("2", 1)})
        rstore.put_checkpoint(run, "s0", ns="sub", parent_id="c0", kind="fork",
                              execution_id="e1", new_values={"y": ("1", 2)})
        rstore.put_writes(run, "c1", "t", [(0, "x", 1)])
        rstore.put_writes(run, "nowhere", "t", [(0, "x", 1)])  # a write without a checkpoint
        rstore.start_receipt(f"{run}/k", run_id=run, step="s", name="n", ordinal=0,
                             owner=new_owner(), may_take_over=False)
        rstore.claim_once(f"{run}/g", run_id=run, owner=new_owner())
    rstore.copy_run("r", "copy")
    rstore.prune_run("copy", keep_latest=1)
    rstore.delete_executions(["e1"])
    assert [c.checkpoint_id for c in rstore.list_checkpoints("r")] == ["c0"]
    rstore.prune_run("s:1", keep_latest=0)
    assert rstore.usage("s:1")["checkpoints"] == 0 and rstore.usage("s:1")["blobs"] == 0
    assert rstore.usage("s:1")["writes"] == 0  # orphaned writes go with the checkpoints
    for run in ("r", "s:1", "copy"):
        rstore.delete_run(run)
    left = sorted(k.decode() for k in raw.scan_iter(match=f"{p}:*"))
    assert left == [f"{p}:meta", f"{p}:seq"]


def test_rewrite_moves_the_parent_index(rstore: Store) -> None:
    rstore.put_checkpoint("r", "p1")
    rstore.put_checkpoint("r", "p2")
    rstore.put_checkpoint("r", "c", parent_id="p1", exclusive_child=True)
    rstore.put_checkpoint("r", "c", parent_id="p2", exclusive_child=True)  # moved away from p1
    rstore.put_checkpoint("r", "d", parent_id="p1", exclusive_child=True)
    with pytest.raises(ConsumeConflict):
        rstore.put_checkpoint("r", "e", parent_id="p2", exclusive_child=True)
    rstore.put_checkpoint("r", "d", parent_id="p1", execution_id="x")
    rstore.put_checkpoint("r", "d", parent_id="p1", execution_id="y")
    rstore.delete_executions(["x"])
    assert rstore.get_checkpoint("r", "d") is not None
    rstore.delete_executions(["y"])
    assert rstore.get_checkpoint("r", "d") is None


def test_timestamps_are_server_clock_microseconds(url: str, rstore: Store,
                                                  raw: redis.Redis) -> None:
    st = rstore.start_receipt("k", run_id="r", step="s", name="n", ordinal=0, owner=new_owner(),
                              may_take_over=False, lease=2.5)
    secs, micros = raw.time()
    server_now = secs + micros / 1e6
    assert abs(st.receipt.started_at - server_now) < 5
    assert abs((st.receipt.lease_until - st.receipt.started_at) - 2.5) < 2e-6
    stored = raw.hget(f"{prefix_of(url)}:rc:k", "lease_until")
    assert stored is not None and re.fullmatch(rb"\d+\.\d{6}", stored)


def test_scripts_reload_after_script_flush(rstore: Store, raw: redis.Redis) -> None:
    rstore.put_checkpoint("r", "c1")
    raw.script_flush()  # what a restart does to the script cache: NOSCRIPT on the next EVALSHA
    rstore.put_checkpoint("r", "c2", parent_id="c1")
    assert rstore.claim_once("g", run_id="r", owner=new_owner()).fence == 1
    assert rstore.get_checkpoint("r").checkpoint_id == "c2"  # type: ignore[union-attr]


def test_transient_errors(rstore: Store) -> None:
    for exc in (rx.ConnectionError("reset"), rx.TimeoutError("slow"),
                rx.BusyLoadingError("loading"), rx.TryAgainError("again")):
        assert rstore._is_transient(exc), exc
    for exc in (rx.AuthenticationError("bad password"), rx.ResponseError("WRONGTYPE"),
                rx.NoScriptError("noscript"), ValueError("x")):
        assert not rstore._is_transient(exc), exc


# ------------------------------------------------------------------------------------- races


def race(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run fn(0..n-1) in n threads released together by a barrier."""
    barrier = threading.Barrier(n)

    def go(i: int) -> Any:
        barrier.wait()
        try:
            return fn(i)
        except ConsumeConflict as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


def test_racing_claims_and_receipts_have_one_winner(rstore: Store) -> None:
    claims = race(8, lambda i: rstore.claim_once("gate", run_id="r", owner=f"o{i}", digest="d"))
    assert sum(not isinstance(c, ConsumeConflict) for c in claims) == 1
    starts = race(8, lambda i: rstore.start_receipt(
        "k", run_id="r", step="s", name="n", ordinal=0, owner=f"o{i}", may_take_over=True))
    assert [s.outcome for s in starts].count("run") == 1
    rstore.put_checkpoint("r", "p")
    kids = race(8, lambda i: rstore.put_checkpoint("r", f"c{i}", parent_id="p",
                                                   exclusive_child=True))
    assert sum(not isinstance(k, ConsumeConflict) for k in kids) == 1
    assert len(list(rstore.list_checkpoints("r"))) == 2


# ----------------------------------------------------------------------------------- restarts


def test_everything_survives_a_kill_and_restart(private_redis: PrivateRedis) -> None:
    url = f"{private_redis.url}?prefix=remit"
    a, b = new_owner(), new_owner()
    with open_store(url) as s:
        first = s.put_checkpoint("r", "c1", new_values={"x": ("1", {"v": 1})})
        s.put_writes("r", "c1", "t", [(0, "x", "w")])
        s.start_receipt("done", run_id="r", step="s", name="n", ordinal=0, owner=a,
                        may_take_over=False)
        s.complete_receipt("done", owner=a, fence=1, result={"txn": 7})
        s.start_receipt("open", run_id="r", step="s", name="n", ordinal=1, owner=a,
                        may_take_over=False)
        s.claim_once("gate", run_id="r", owner=b, digest="d", value="v")
        s.consume_claim("gate", owner=b, fence=1)
    private_redis.kill()
    private_redis.start()
    with open_store(url) as s:
        got = s.get_checkpoint("r")
        assert got is not None and got.values == {"x": {"v": 1}} and got.seq == first.seq
        assert [w.value for w in got.writes] == ["w"]
        assert s.get_receipt("done").result == {"txn": 7}  # type: ignore[union-attr]
        assert s.start_receipt("done", run_id="r", step="s", name="n", ordinal=0,
                               owner=b, may_take_over=False).outcome == "done"
        assert s.get_receipt("open").status == "started"  # type: ignore[union-attr]
        with pytest.raises(ConsumeConflict):
            s.claim_once("gate", run_id="r", owner=a)
        assert s.put_checkpoint("r", "c2", parent_id="c1").seq > first.seq
        assert s.usage("r")["receipts"] == 2 and s.usage("r")["claims"] == 1


def test_an_operation_retries_across_a_restart(private_redis: PrivateRedis) -> None:
    url = f"{private_redis.url}?prefix=remit"
    calling = threading.Event()  # set right before the operation is called
    retried = threading.Event()  # set when the store logs its first transient failure

    class OnRetry(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "transient store error" in record.getMessage():
                retried.set()

    logger = logging.getLogger("remit")
    handler = OnRetry(logging.WARNING)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.WARNING)
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            assert calling.wait(30) and retried.wait(30)
            private_redis.start()  # at once: the operation is in its back-off
        except BaseException as exc:
            errors.append(exc)

    try:
        with open_store(url) as s:
            s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
            owner = new_owner()
            s.claim_once("gate", run_id="r", owner=owner)
            private_redis.kill()
            thread = threading.Thread(target=restart, daemon=True)
            thread.start()
            calling.set()
            written = s.put_checkpoint("r", "c2", parent_id="c1", new_values={"x": ("2", 2)})
            thread.join(30)
            assert not errors and retried.is_set()
            latest = s.get_checkpoint("r")
            assert latest is not None and latest.checkpoint_id == "c2" and latest.values == {"x": 2}
            assert latest.seq == written.seq
            assert s.claim_once("gate", run_id="r", owner=owner).fence == 1  # reentered
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_long_run_listing_is_read_a_page_at_a_time_in_the_same_order(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script blocks the server while it runs, so a listing longer than a page is read
    page by page (each continuing after the last run of the one before): the same runs
    in the same order as one read, with and without a limit and a status filter."""
    import remit_core.store.redis as backend

    with open_store(url) as s:
        for i in range(11):
            start = s.start_run(f"paged-{i:02d}", framework="fw", name="g", owner="o")
            assert start.run is not None
            if i % 3 == 0:
                s.end_run(f"paged-{i:02d}", owner="o", fence=start.run.fence, status="done")
        queries: list[dict[str, Any]] = [
            {"name": "g"}, {"name": "g", "limit": 8}, {"framework": "fw", "status": "running"},
            {"name": "g", "status": "done", "limit": 2}]
        whole = [[i.run_id for i in s.list_runs(**q)] for q in queries]
        calls = 0
        page = backend.RedisStore._lifecycles_page

        def counted(self: Any, query: Any) -> Any:
            nonlocal calls
            calls += 1
            return page(self, query)

        monkeypatch.setattr(backend, "LIST_PAGE", 3)
        monkeypatch.setattr(backend.RedisStore, "_lifecycles_page", counted)
        paged = [[i.run_id for i in s.list_runs(**q)] for q in queries]
    assert [len(w) for w in whole] == [11, 8, 7, 2]
    assert paged == whole
    assert calls == 4 + 3 + 3 + 1  # ceil(11/3) (the last one short), 3 for 8, 3 for 7, 1
