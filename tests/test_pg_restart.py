"""A private PostgreSQL is restarted in the middle of a sequence of store operations.

The operations retry (tenacity, bounded) and succeed, with nothing lost or
duplicated. The server is stopped *before* the worker continues (an Event,
not a sleep), so the next operations are certain to meet the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from remit_core import ConsumeConflict, Store, open_store
from remit_core.store import new_owner
from tests.conftest import free_port, unavailable


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return os.path.dirname(found[-1])
    which = shutil.which("pg_ctl")
    return os.path.dirname(which) if which else None


class PrivatePostgres:
    def __init__(self, root: Path) -> None:
        bindir = _pg_bin()
        if bindir is None:
            unavailable("PostgreSQL server binaries (pg_ctl, initdb) are not installed")
        self.bindir = str(bindir)
        self.data = root / "pgdata"
        self.port = free_port()
        self.log = root / "pg.log"
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root: run the server as postgres
            import pwd

            pw = pwd.getpwnam("postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
            os.chown(root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self.as_user, os.path.join(self.bindir, tool), *args]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       stdin=subprocess.DEVNULL, timeout=120)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.log), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    pytest.importorskip("psycopg")
    root = Path(tempfile.mkdtemp(prefix="remit-pg-"))  # outside pytest's private tmp (0700)
    os.chmod(root, 0o755)
    pg = PrivatePostgres(root)
    pg.start()
    try:
        yield pg
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_operations_survive_a_restart(private_pg: PrivatePostgres,
                                      caplog: pytest.LogCaptureFixture, mode: str) -> None:
    """``async``: the same operations through the coroutine API, on the event loop's own
    async connections (remit_core.aio), which the restart breaks while they are idle."""
    n, restart_at = 60, 20
    reached = threading.Event()
    stopped = threading.Event()
    errors: list[BaseException] = []
    results: dict[str, Any] = {"claims": []}

    async def sequence(store: Store, asynchronous: bool) -> None:
        async def call(name: str, *args: Any, **kwargs: Any) -> Any:
            if asynchronous:
                return await getattr(store, f"a{name}")(*args, **kwargs)
            return getattr(store, name)(*args, **kwargs)

        parent = None
        for i in range(n):
            if i == restart_at:
                reached.set()
                assert stopped.wait(60)
            cid = f"c{i:03d}"
            await call("put_checkpoint", "r", cid, parent_id=parent, metadata={"i": i},
                       new_values={"i": (str(i), i)})
            await call("put_writes", "r", cid, "t", [(0, "w", i)])
            owner = new_owner()
            claim = await call("claim_once", f"k{i}", run_id="r", owner=owner, lease=60)
            await call("consume_claim", f"k{i}", owner=owner, fence=claim.fence)
            results["claims"].append(claim.fence)
            parent = cid

    def worker() -> None:
        try:
            store = open_store(private_pg.url, lease=60)
            asyncio.run(sequence(store, asynchronous=mode == "async"))
            store.close()
        except BaseException as exc:
            errors.append(exc)
            reached.set()

    with caplog.at_level(logging.WARNING, logger="remit"):
        t = threading.Thread(target=worker)
        t.start()
        assert reached.wait(120)
        private_pg.stop()   # the worker's next operation meets a dead server
        stopped.set()
        private_pg.start()
        t.join(timeout=300)
    assert not errors, errors
    assert any("transient store error" in r.message for r in caplog.records), \
        "no operation met the outage"

    with open_store(private_pg.url) as store:
        cps = list(store.list_checkpoints("r"))
        assert [c.metadata["i"] for c in cps] == list(range(n - 1, -1, -1))  # none lost or twice
        assert all(c.values == {"i": c.metadata["i"]} for c in cps)
        assert all([w.value for w in c.writes] == [c.metadata["i"]] for c in cps)
        claims = store.list_claims("r")
        assert len(claims) == n and all(c.status == "consumed" for c in claims)
        assert results["claims"] == [1] * n  # each claimed once, by its one owner
        with pytest.raises(ConsumeConflict):
            store.claim_once("k0", run_id="r", owner=new_owner())
