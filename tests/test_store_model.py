"""A stateful model test of the Store, on SQLite, PostgreSQL and Redis.

Hypothesis runs random sequences of store operations against :class:`Model`, a
plain in-memory reference of the store written from the docstrings of
``remit_core.store.decisions`` (the decision tables of ``start_receipt`` and
``claim``) and ``remit_core.store.base`` (the checkpoint semantics of
``put_checkpoint`` and friends), and checks after every step that the store and the
model agree. The last section of this file checks every backend, the Redis Lua scripts
included, against the pure functions of ``decisions`` themselves, on every combination
of stored record and request.

* **Time.** The model has no wall clock. Every lease is either long (60 s: it
  never expires during an example) or tiny (1 ms); after an operation grants a
  tiny lease, the machine polls the stored row until ``time.time() > lease_until``
  (bounded) and from then on the model knows the lease has expired. So every
  outcome (``busy``/``in_doubt``/``taken_over``, ``held``/``mismatch``) is decided
  by the model, never by a race with the clock.
* **Crashes.** ``crash`` (at most ``MAX_CRASHES`` per example) abandons the
  current Store object without closing it and opens a new one on the same URL,
  which must read back everything committed. The owners of the crashed
  "process" (generation) are dead: they never start or claim again, their long
  leases stay busy and their tiny leases are there to be taken over (or found in
  doubt). Their grants stay in the bundles, so a zombie that wakes up later and
  writes with its old fence is exercised too (it must be fenced out). On SQLite
  a crash also abandons an open ``BEGIN IMMEDIATE`` transaction (a raw
  connection that wrote and was closed without commit), or (once per example)
  runs a writer process that is SIGKILLed in the middle of a large transaction
  whose pages spilled into the WAL.
* **Failed writes.** A validator that raises, or an unserialisable value, must
  leave the store exactly as it was.

Where the docstrings leave a corner open, the model follows the reference
backend (``store/sqlite.py``): a (channel, version) blob is insert-if-absent
(the first value stays); ``copy_run`` into a run that already has a checkpoint
id keeps the target's checkpoint and blobs and adds the source's missing writes;
``copy_run`` copies every blob of the source run, referenced or not. A run whose
checkpoints were all pruned may or may not still be listed by ``list_runs``, and
``before=`` is only checked when the id names one namespace of the run.

One store URL serves all examples of a test (the conftest fixture), and one
Store opened by the test serves every example until it crashes (opening a
connection pool per example would dominate the run time on PostgreSQL). Each
example gives the names it sends to the store (runs, keys, execution ids) a
fresh prefix, ignores other examples' records in the store-wide listings, and
deletes its runs at teardown; a failing example prints the unprefixed names.
``REMIT_MODEL_EXAMPLES=2000`` (with ``--timeout=0``) runs a longer soak.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from remit_core import ConsumeConflict, SerializationError, StateValidationError, open_store
from remit_core.errors import LeaseLost
from remit_core.records import Checkpoint, Claim, ClaimRow, Receipt, ReceiptRow, Recovery, RunRow
from remit_core.store import Store, chunks, decisions
from remit_core.store.decisions import Verdict
from remit_core.store.redis import RedisStore
from remit_core.store.sql import SqlStore
from tests.conftest import FULL

# ------------------------------------------------------------------------------------ pools

RUNS = ("r0", "r1", "r2")
NSS = ("", "sub:1")
CIDS = ("c0", "c1", "c2", "c3")
KINDS = ("step", "fork")
CHANNELS = ("x", "y")
VERSIONS = ("1", "2", "3", "4")
TASKS = ("t0", "t1")
EXECS = ("e0", "e1")
RECEIPT_KEYS = {"r0/fx": "r0", "r1/fx": "r1"}  # key -> run (few keys: they contend)
CLAIM_KEYS = {"r0/gate": "r0", "r1/gate": "r1"}
DIGESTS = ("d1", "d2", None)
OWNERS = 2  # live owners per process generation
MAX_CRASHES = 2  # per example (a reopen is slow on a server)

LONG = 60.0  # never expires within an example
TINY = 0.001  # expired before the next step (the machine waits for it)
EXPIRY_WAIT = 5.0  # bound on that wait

#: examples per backend: 100 in the default run, 200 under REMIT_FULL / a nox session
#: (REMIT_MODEL_EXAMPLES sets any other number)
EXAMPLES = 200 if FULL else 100

SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=20,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)
if os.environ.get("REMIT_MODEL_EXAMPLES"):  # a longer soak: REMIT_MODEL_EXAMPLES=2000
    SETTINGS = settings(SETTINGS, max_examples=int(os.environ["REMIT_MODEL_EXAMPLES"]))

# Large values: the machine's stores chunk every value of CHUNK_THRESHOLD encoded bytes or
# more, so these are stored as chunks; they share runs of bytes, hence chunks, with each
# other, so that collecting one value's chunks must keep those another value still uses.
_NOISE = bytes((i * 7919 + 13) % 251 for i in range(1200))
BIG = (_NOISE, _NOISE[:700] + b"tail", bytes(range(256)) * 3)
CHUNK_THRESHOLD = 300
CHUNK_SIZE = 256  # FastCDC's smallest average

leaves = (st.none() | st.booleans() | st.integers(-3, 3) | st.text("ab", max_size=2)
          | st.binary(max_size=2) | st.sampled_from(BIG))
VALUES = st.recursive(
    leaves,
    lambda inner: (st.lists(inner, max_size=2) | st.tuples(inner)
                   | st.dictionaries(st.sampled_from("kl"), inner, max_size=2)),
    max_leaves=3,
)

VERSION_MAPS = st.none() | st.dictionaries(st.sampled_from(CHANNELS), st.sampled_from(VERSIONS),
                                           max_size=2)
NEW_VALUES = st.dictionaries(st.sampled_from(CHANNELS),
                             st.tuples(st.sampled_from(VERSIONS), VALUES), max_size=2)

CkKey = tuple[str, str, str]  # (run, ns, checkpoint_id)


def same(a: Any, b: Any) -> bool:
    """Equality that also requires equal types (True is not 1, a tuple is not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# ------------------------------------------------------------------------------------ model


@dataclass
class MCheckpoint:
    parent_id: str | None
    kind: str
    execution_id: str | None
    data: Any
    metadata: Any
    versions: dict[str, str]
    order: int  # model write order: a higher order must have a higher store seq
    seq: int | None = None  # the store's seq, once observed (it never changes afterwards)
    floor: int | None = None  # for a copy: the highest seq observed before copy_run


@dataclass
class MReceipt:
    run_id: str
    status: str  # started | completed
    owner: str
    fence: int
    attempt: int
    expired: bool
    result: Any = None


@dataclass
class MClaim:
    run_id: str
    status: str  # claimed | consumed | released
    owner: str
    fence: int
    digest: str | None
    value: Any
    expired: bool


class Model:
    """The store as the docstrings of ``remit_core.store.decisions`` and ``.base``
    describe it."""

    def __init__(self) -> None:
        self.checkpoints: dict[CkKey, MCheckpoint] = {}
        self.blobs: dict[tuple[str, str, str, str], Any] = {}  # (run, ns, channel, version)
        self.writes: dict[tuple[str, str, str, str, int], tuple[str, Any, str]] = {}
        self.receipts: dict[str, MReceipt] = {}
        self.claims: dict[str, MClaim] = {}
        self.runs: set[str] = set()
        self.clock = 0

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    # -------------------------------------------------------------------------- checkpoints

    def rivals(self, run: str, ns: str, cid: str, parent: str | None, kind: str) -> set[str]:
        """Ids that make an exclusive_child write of ``cid`` conflict."""
        if parent is None:
            return set()
        return {k[2] for k, c in self.checkpoints.items()
                if k[:2] == (run, ns) and k[2] != cid and c.parent_id == parent
                and c.kind == kind}

    def put_checkpoint(self, run: str, ns: str, cid: str, *, parent_id: str | None, kind: str,
                       data: Any, metadata: Any, versions: dict[str, str] | None,
                       new_values: dict[str, tuple[str, Any]], execution_id: str | None) -> None:
        all_versions = dict(versions) if versions is not None else {}
        for channel, (version, _) in new_values.items():
            all_versions.setdefault(channel, version)
        for channel, (version, value) in new_values.items():
            self.blobs.setdefault((run, ns, channel, version), value)  # stored once
        self.runs.add(run)
        old = self.checkpoints.get((run, ns, cid))
        self.checkpoints[(run, ns, cid)] = MCheckpoint(
            parent_id, kind, execution_id, data, metadata, all_versions,
            order=old.order if old else self._tick(), seq=old.seq if old else None)

    def values_of(self, key: CkKey) -> dict[str, Any]:
        run, ns, _ = key
        versions = self.checkpoints[key].versions
        return {ch: self.blobs[(run, ns, ch, v)] for ch, v in versions.items()
                if (run, ns, ch, v) in self.blobs}

    def writes_of(self, key: CkKey) -> list[tuple[str, int, str, Any, str]]:
        return sorted(((k[3], k[4], *w) for k, w in self.writes.items() if k[:3] == key),
                      key=lambda w: (w[0], w[1]))

    def newest_first(self, keys: Iterable[CkKey]) -> list[CkKey]:
        return sorted(keys, key=lambda k: self.checkpoints[k].order, reverse=True)

    def latest(self, run: str, ns: str) -> CkKey | None:
        keys = self.newest_first(k for k in self.checkpoints if k[:2] == (run, ns))
        return keys[0] if keys else None

    def listing(self, run: str | None, ns: str | None, before: str | None, limit: int | None,
                execution_ids: list[str] | None) -> list[CkKey] | None:
        """Expected ``list_checkpoints`` keys, or None when ``before`` is ambiguous."""
        keys = [k for k, c in self.checkpoints.items()
                if (run is None or k[0] == run) and (ns is None or k[1] == ns)
                and (execution_ids is None or c.execution_id in execution_ids)]
        if before is not None:
            named = [k for k in self.checkpoints if k[0] == run and k[2] == before]
            if not named:
                return []
            if len({k[1] for k in named}) > 1:
                return None
            bound = self.checkpoints[named[0]].order
            keys = [k for k in keys if self.checkpoints[k].order < bound]
        keys = self.newest_first(keys)
        return keys if limit is None else keys[:limit]

    def put_writes(self, key: CkKey, task_id: str, writes: list[tuple[int, str, Any]],
                   task_path: str, overwrite: bool) -> None:
        for idx, channel, value in writes:
            wkey = (*key, task_id, idx)
            if overwrite or wkey not in self.writes:
                self.writes[wkey] = (channel, value, task_path)

    def _drop_orphans(self, run: str) -> None:
        for wkey in [w for w in self.writes if w[0] == run and w[:3] not in self.checkpoints]:
            del self.writes[wkey]
        used = {(k[0], k[1], ch, v) for k, c in self.checkpoints.items() if k[0] == run
                for ch, v in c.versions.items()}
        for bkey in [b for b in self.blobs if b[0] == run and b not in used]:
            del self.blobs[bkey]

    def delete_run(self, run: str) -> None:
        self.checkpoints = {k: c for k, c in self.checkpoints.items() if k[0] != run}
        self.blobs = {k: v for k, v in self.blobs.items() if k[0] != run}
        self.writes = {k: w for k, w in self.writes.items() if k[0] != run}
        for key in [k for k, r in self.receipts.items() if r.run_id == run]:
            del self.receipts[key]
        for key in [k for k, c in self.claims.items() if c.run_id == run]:
            del self.claims[key]
        self.runs.discard(run)

    def copy_run(self, source: str, target: str) -> None:
        if source not in self.runs:
            return
        self.runs.add(target)
        for k in self.newest_first(k for k in self.checkpoints if k[0] == source)[::-1]:
            dst = (target, k[1], k[2])
            if dst not in self.checkpoints:
                c = self.checkpoints[k]
                self.checkpoints[dst] = MCheckpoint(
                    c.parent_id, c.kind, c.execution_id, c.data, c.metadata, dict(c.versions),
                    order=self._tick())
        for b in [b for b in self.blobs if b[0] == source]:
            self.blobs.setdefault((target, *b[1:]), self.blobs[b])
        for w in [w for w in self.writes if w[0] == source]:
            self.writes.setdefault((target, *w[1:]), self.writes[w])

    def prune_run(self, run: str, keep: int) -> None:
        for ns in {k[1] for k in self.checkpoints if k[0] == run}:
            for k in self.newest_first(k for k in self.checkpoints if k[:2] == (run, ns))[keep:]:
                del self.checkpoints[k]
        self._drop_orphans(run)

    def delete_executions(self, execution_ids: list[str]) -> None:
        gone = [k for k, c in self.checkpoints.items() if c.execution_id in execution_ids]
        for k in gone:
            del self.checkpoints[k]
        for run in {k[0] for k in gone}:
            self._drop_orphans(run)

    def usage(self) -> dict[str, int]:
        return {"checkpoints": len(self.checkpoints), "blobs": len(self.blobs),
                "writes": len(self.writes), "receipts": len(self.receipts),
                "claims": len(self.claims)}

    # ------------------------------------------------------------------------------ receipts

    def start_receipt(self, key: str, run_id: str, owner: str, expired: bool,
                      may_take_over: bool) -> tuple[str, bool]:
        """The ``_start_receipt`` decision table: (outcome, whether a lease was written)."""
        r = self.receipts.get(key)
        if r is None:
            self.receipts[key] = MReceipt(run_id, "started", owner, 1, 1, expired)
            return "run", True
        if r.status == "completed":
            return "done", False
        if r.owner == owner:
            return "run", False
        if not r.expired:
            return "busy", False
        if not may_take_over:
            return "in_doubt", False
        r.owner, r.fence, r.attempt, r.expired = owner, r.fence + 1, r.attempt + 1, expired
        return "taken_over", True

    def _owned_receipt(self, key: str, owner: str, fence: int) -> MReceipt | None:
        r = self.receipts.get(key)
        return r if r is not None and r.owner == owner and r.fence == fence else None

    def complete_receipt(self, key: str, owner: str, fence: int, result: Any) -> bool:
        r = self._owned_receipt(key, owner, fence)
        if r is None:
            return False
        r.status, r.result = "completed", result
        return True

    def release_receipt(self, key: str, owner: str, fence: int) -> bool:
        r = self._owned_receipt(key, owner, fence)
        if r is None or r.status != "started":
            return False
        del self.receipts[key]
        return True

    def renew_receipt(self, key: str, owner: str, fence: int, expired: bool) -> bool:
        r = self._owned_receipt(key, owner, fence)
        if r is None or r.status != "started":
            return False
        r.expired = expired
        return True

    # -------------------------------------------------------------------------------- claims

    def claim(self, key: str, run_id: str, owner: str, expired: bool, digest: str | None,
              value: Any) -> tuple[str, bool]:
        """The ``_claim`` decision table: (outcome, whether a lease was written)."""
        c = self.claims.get(key)
        if c is None:
            self.claims[key] = MClaim(run_id, "claimed", owner, 1, digest, value, expired)
            return "won", True
        if c.status == "consumed":
            return "consumed", False
        if c.status == "released":
            c.status, c.owner, c.fence = "claimed", owner, c.fence + 1
            c.digest, c.value, c.expired = digest, value, expired
            return "won", True
        if c.owner == owner:
            return "reentered", False
        if not c.expired:
            return "held", False
        if digest is not None and c.digest is not None and digest != c.digest:
            return "mismatch", False
        c.owner, c.fence, c.expired = owner, c.fence + 1, expired
        return "taken_over", True

    def _owned_claim(self, key: str, owner: str, fence: int) -> MClaim | None:
        c = self.claims.get(key)
        return c if c is not None and c.owner == owner and c.fence == fence else None

    def consume_claim(self, key: str, owner: str, fence: int, digest: str | None) -> bool:
        c = self._owned_claim(key, owner, fence)
        if c is None or c.status == "released":
            return False
        if c.status == "claimed":
            c.status = "consumed"
            if digest is not None:
                c.digest = digest
        return True  # claimed now, or already consumed by this owner and fence (a retry)

    def release_claim(self, key: str, owner: str, fence: int) -> bool:
        c = self._owned_claim(key, owner, fence)
        if c is None or c.status != "claimed":
            return False
        c.status = "released"
        return True

    def renew_claim(self, key: str, owner: str, fence: int, expired: bool) -> bool:
        c = self._owned_claim(key, owner, fence)
        if c is None or c.status != "claimed":
            return False
        c.expired = expired
        return True


# ------------------------------------------------------------------------- crash helpers

# A writer process killed (SIGKILL) in the middle of a large transaction: with a tiny page
# cache its dirty pages spill into the WAL before the commit that never comes.
KILLED_WRITER = r"""
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("PRAGMA cache_size=1")
conn.execute("BEGIN IMMEDIATE")
for table in ("remit_checkpoints", "remit_blobs", "remit_writes", "remit_receipts",
              "remit_claims"):
    conn.execute(f"DELETE FROM {table}")
conn.executemany("INSERT INTO remit_blobs VALUES ('r0', '', ?, '1', ?)",
                 [(f"junk{i}", b"j" * 4096) for i in range(64)])
conn.execute("UPDATE remit_runs SET updated_at = 0")
os.kill(os.getpid(), signal.SIGKILL)
"""


def abandon_open_transaction(path: str) -> None:
    """A connection that began a write transaction, wrote, and went away uncommitted."""
    raw = sqlite3.connect(path, isolation_level=None, timeout=30)
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("DELETE FROM remit_checkpoints WHERE seq % 2 = 0")
    raw.execute("UPDATE remit_claims SET status = 'consumed', owner = 'ghost'")
    raw.execute("UPDATE remit_receipts SET status = 'completed', owner = 'ghost'")
    raw.execute("INSERT INTO remit_writes VALUES ('r0', '', 'c0', 'ghost', 0, 'x', x'00', '')")
    raw.close()  # no COMMIT: rolled back


def kill_writer_mid_transaction(path: str) -> None:
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", KILLED_WRITER, path],
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


# ---------------------------------------------------------------------------------- machine


def small_chunks(store: Store) -> Store:
    store.chunk_threshold, store.chunk_size = CHUNK_THRESHOLD, CHUNK_SIZE
    return store


class StoreMachine(RuleBasedStateMachine):
    """One store (one URL) against one :class:`Model`, with crashes in between.

    Rules take the logical names of the pools; every name that reaches the store
    (run ids, receipt and claim keys, execution ids) carries this example's
    prefix, and the model holds the prefixed names.
    """

    receipt_grants = Bundle("receipt_grants")  # (key, owner, fence) ever granted
    claim_grants = Bundle("claim_grants")

    def __init__(self, url: str, backend: str, store: Store) -> None:
        super().__init__()
        self.url = url
        self.backend = backend
        self.prefix = f"m{uuid.uuid4().hex[:10]}."
        self.model = Model()
        self.gen = 0  # process generation; its owners die at the next crash
        self.max_seq = 0
        self.writer_killed = False
        self.graveyard: list[Store] = []  # stores of crashed processes
        self.shared = store  # opened once per test (opening a pool per example is slow)
        self.store = small_chunks(store)
        # Other examples of this test share the store; they cleaned up after themselves
        # unless delete_run is broken, and then their leftovers are this baseline.
        self.baseline = self.usage_counts()

    def teardown(self) -> None:
        try:
            for run in RUNS:
                self.store.delete_run(self.p(run))
        finally:
            for s in {id(s): s for s in [self.store, *self.graveyard]}.values():
                if s is not self.shared:
                    s.close()

    def p(self, name: str) -> str:
        return self.prefix + name

    def ours(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def owner(self, who: int) -> str:
        return f"p{self.gen}-o{who}"

    def usage_counts(self) -> dict[str, int]:
        got = self.store.usage()
        for key in ("blob_bytes", "chunks", "chunk_bytes"):  # checked by chunks_collected
            got.pop(key)
        return got

    def chunks_collected(self, run: str) -> None:
        """Right after a prune or a delete, the run keeps exactly the chunks its remaining
        values (blobs and writes, as the model has them) are cut into."""
        values = [v for (r, *_), v in self.model.blobs.items() if r == run]
        values += [w[1] for (r, *_), w in self.model.writes.items() if r == run]
        want: dict[bytes, bytes] = {}
        for value in values:
            encoded = self.store.serde.encode(value)
            if len(encoded) >= self.store.chunk_threshold:
                chunks.split(encoded, size=self.store.chunk_size, into=want)
        assert self.store.usage(run)["chunks"] == len(want), (run, len(want))

    # ----------------------------------------------------------------------- comparisons

    def see_seq(self, key: CkKey, seq: int) -> None:
        m = self.model.checkpoints[key]
        if m.seq is None:
            floor = self.max_seq if m.floor is None else m.floor
            assert seq > floor, f"{key}: new seq {seq} not above {floor}"
            m.seq = seq
        assert seq == m.seq, f"{key}: seq changed from {m.seq} to {seq}"
        self.max_seq = max(self.max_seq, seq)

    def check_checkpoint(self, got: Checkpoint, key: CkKey, with_writes: bool) -> None:
        m = self.model.checkpoints[key]
        assert (got.run_id, got.ns, got.checkpoint_id) == key
        assert (got.parent_id, got.kind, got.execution_id) == (m.parent_id, m.kind,
                                                               m.execution_id), key
        assert same(got.data, m.data) and same(got.metadata, m.metadata), (key, got, m)
        assert got.versions == m.versions, (key, got.versions, m.versions)
        want = self.model.values_of(key)
        assert same(got.values, want), (key, got.values, want)
        writes = [(w.task_id, w.idx, w.channel, w.value, w.task_path) for w in got.writes]
        want_w = self.model.writes_of(key) if with_writes else []
        assert same(writes, want_w), (key, writes, want_w)
        self.see_seq(key, got.seq)

    def check_receipt(self, got: Receipt) -> None:
        m = self.model.receipts[got.key]
        assert (got.run_id, got.step, got.name, got.ordinal) == (m.run_id, "s", got.key, 0)
        assert (got.status, got.owner, got.fence, got.attempt) == (
            m.status, m.owner, m.fence, m.attempt), (got, m)
        if m.status == "completed":
            assert same(got.result, m.result) and got.completed_at is not None, (got, m)
        else:
            assert got.result is None and got.completed_at is None, got
            now = time.time()
            assert (got.lease_until < now) if m.expired else (got.lease_until > now), (got, m)

    def check_claim(self, got: Claim) -> None:
        m = self.model.claims[got.key]
        assert (got.run_id, got.status, got.fence) == (m.run_id, m.status, m.fence), (got, m)
        if m.status != "released":  # what a released claim keeps is not specified
            assert (got.owner, got.digest) == (m.owner, m.digest), (got, m)
            assert same(got.value, m.value), (got, m)
        assert (got.consumed_at is not None) == (m.status == "consumed"), (got, m)
        if m.status == "claimed":
            now = time.time()
            assert (got.lease_until < now) if m.expired else (got.lease_until > now), (got, m)

    def await_expiry(self, read_lease_until: Callable[[], float]) -> None:
        """Poll the stored row until its tiny lease is over (a time condition, bounded)."""
        deadline = time.monotonic() + EXPIRY_WAIT
        while not time.time() > read_lease_until():
            assert time.monotonic() < deadline, "a 1 ms lease did not expire within 5 s"
            time.sleep(0.0005)

    def receipt_lease(self, key: str) -> float:
        r = self.store.get_receipt(key)
        assert r is not None
        return r.lease_until

    def claim_lease(self, key: str) -> float:
        c = self.store.get_claim(key)
        assert c is not None
        return c.lease_until

    # ----------------------------------------------------------------------- checkpoints

    def _put(self, run: str, ns: str, cid: str, parent: str | None, kind: str, data: Any,
             metadata: Any, versions: dict[str, str] | None,
             new_values: dict[str, tuple[str, Any]], execution_id: str | None,
             exclusive: bool) -> None:
        def put() -> Checkpoint:
            return self.store.put_checkpoint(
                run, cid, ns=ns, parent_id=parent, kind=kind, data=data, metadata=metadata,
                versions=versions, new_values=new_values, execution_id=execution_id,
                exclusive_child=exclusive)

        rivals = self.model.rivals(run, ns, cid, parent, kind) if exclusive else set()
        if rivals:
            with pytest.raises(ConsumeConflict) as info:
                put()
            assert info.value.owner in rivals and info.value.run_id == run, info.value
            return
        got = put()
        self.model.put_checkpoint(run, ns, cid, parent_id=parent, kind=kind, data=data,
                                  metadata=metadata, versions=versions, new_values=new_values,
                                  execution_id=execution_id)
        assert got.checkpoint_id == cid and got.versions == self.model.checkpoints[
            (run, ns, cid)].versions
        self.see_seq((run, ns, cid), got.seq)

    def _put_writes(self, key: CkKey, task_id: str, writes: list[tuple[int, str, Any]],
                    task_path: str, overwrite: bool) -> None:
        run, ns, cid = key
        self.store.put_writes(run, cid, task_id, writes, ns=ns, task_path=task_path,
                              overwrite=overwrite)
        self.model.put_writes(key, task_id, writes, task_path, overwrite)

    @initialize(histories=st.lists(
        st.tuples(st.sampled_from(RUNS), st.sampled_from(NSS),
                  st.lists(VALUES, min_size=1, max_size=len(CIDS)), st.booleans()),
        max_size=3))
    def seed(self, histories: list[tuple[str, str, list[Any], bool]]) -> None:
        """Start from a few linear histories c0 <- c1 <- ...: channel x gets a new version
        at every step, channel y keeps the one written by c0 (as a graph runtime does)."""
        for run, ns, values, with_writes in histories:
            parent = None
            for i, value in enumerate(values):
                cid = CIDS[i]
                new = {"x": (VERSIONS[i], value)} | ({"y": ("1", i)} if i == 0 else {})
                self._put(self.p(run), ns, cid, parent, "step", {"step": i}, None,
                          {"x": VERSIONS[i], "y": "1"}, new, self.p(EXECS[i % 2]),
                          exclusive=True)
                parent = cid
            if with_writes and parent is not None:
                self._put_writes((self.p(run), ns, parent), "t0", [(0, "x", "w")], "", False)

    @rule(run=st.sampled_from(RUNS), ns=st.sampled_from(NSS), cid=st.sampled_from(CIDS),
          parent=st.none() | st.sampled_from(CIDS), kind=st.sampled_from(KINDS),
          data=VALUES, metadata=VALUES, versions=VERSION_MAPS, new_values=NEW_VALUES,
          execution=st.none() | st.sampled_from(EXECS), exclusive=st.booleans())
    def put_checkpoint(self, run: str, ns: str, cid: str, parent: str | None, kind: str,
                       data: Any, metadata: Any, versions: dict[str, str] | None,
                       new_values: dict[str, tuple[str, Any]], execution: str | None,
                       exclusive: bool) -> None:
        self._put(self.p(run), ns, cid, parent, kind, data, metadata, versions, new_values,
                  None if execution is None else self.p(execution), exclusive)

    @precondition(lambda self: self.model.checkpoints)
    @rule(draw=st.data(), sibling=st.booleans(), cid=st.sampled_from(CIDS),
          kind=st.sampled_from(KINDS), data=VALUES, versions=VERSION_MAPS,
          new_values=NEW_VALUES, execution=st.none() | st.sampled_from(EXECS),
          exclusive=st.booleans())
    def put_child(self, draw: st.DataObject, sibling: bool, cid: str, kind: str, data: Any,
                  versions: dict[str, str] | None, new_values: dict[str, tuple[str, Any]],
                  execution: str | None, exclusive: bool) -> None:
        """A successor of an existing checkpoint, or a second successor of an existing
        checkpoint's parent (so that exclusive_child meets rivals)."""
        children = sorted(k for k, c in self.model.checkpoints.items() if c.parent_id)
        if sibling and children:
            run, ns, base = draw.draw(st.sampled_from(children), label="sibling of")
            parent = self.model.checkpoints[(run, ns, base)].parent_id
            kind = self.model.checkpoints[(run, ns, base)].kind
        else:
            run, ns, parent = draw.draw(st.sampled_from(sorted(self.model.checkpoints)),
                                        label="child of")
        self._put(run, ns, cid, parent, kind, data, {"parent": parent}, versions, new_values,
                  None if execution is None else self.p(execution), exclusive)

    @precondition(lambda self: self.model.checkpoints)
    @rule(draw=st.data(), task_id=st.sampled_from(TASKS),
          writes=st.lists(st.tuples(st.integers(-3, 2),
                                    st.sampled_from((*CHANNELS, "__resume__")), VALUES),
                          max_size=3, unique_by=lambda w: w[0]),
          task_path=st.sampled_from(("", "p")), overwrite=st.booleans())
    def put_writes(self, draw: st.DataObject, task_id: str, writes: list[tuple[int, str, Any]],
                   task_path: str, overwrite: bool) -> None:
        key = draw.draw(st.sampled_from(sorted(self.model.checkpoints)), label="checkpoint")
        self._put_writes(key, task_id, writes, task_path, overwrite)

    @rule(what=st.sampled_from(("get", "list", "list_before", "list_all", "list_runs",
                                "everything")),
          draw=st.data(), run=st.sampled_from(RUNS), ns=st.none() | st.sampled_from(NSS),
          cid=st.none() | st.sampled_from(CIDS), limit=st.none() | st.integers(0, 3),
          executions=st.none() | st.lists(st.sampled_from(EXECS), min_size=1, unique=True),
          with_writes=st.booleans())
    def read(self, what: str, draw: st.DataObject, run: str, ns: str | None, cid: str | None,
             limit: int | None, executions: list[str] | None, with_writes: bool) -> None:
        """get_checkpoint (latest, or ``cid``), list_checkpoints of a run (``cid`` as
        ``before``; or before a stored checkpoint) or of all runs, list_runs, or every
        checkpoint with its writes."""
        execution_ids = None if executions is None else [self.p(e) for e in executions]
        if what == "get":
            self.check_get(self.p(run), ns or "", cid, with_writes)
        elif what == "list":
            self.check_list(self.p(run), ns, cid, limit, execution_ids, with_writes)
        elif what == "list_before" and self.model.checkpoints:
            key = draw.draw(st.sampled_from(sorted(self.model.checkpoints)), label="before")
            self.check_list(key[0], ns, key[2], limit, execution_ids, with_writes)
        elif what == "list_all":
            self.check_list(None, ns, None, limit, execution_ids, with_writes)
        elif what == "list_runs":
            self.check_list_runs(None if limit == 0 else limit)
        else:
            self.check_everything()

    def check_get(self, run: str, ns: str, cid: str | None, with_writes: bool) -> None:
        got = self.store.get_checkpoint(run, cid, ns=ns, with_writes=with_writes)
        key = self.model.latest(run, ns) if cid is None else (run, ns, cid)
        if key is None or key not in self.model.checkpoints:
            assert got is None, got
        else:
            assert got is not None, key
            self.check_checkpoint(got, key, with_writes)

    def check_list(self, run: str | None, ns: str | None, before: str | None,
                   limit: int | None, execution_ids: list[str] | None,
                   with_writes: bool) -> None:
        want = self.model.listing(run, ns, before, limit, execution_ids)
        got = [c for c in self.store.list_checkpoints(
            run, ns=ns, before=before, limit=limit, execution_ids=execution_ids,
            with_writes=with_writes) if self.ours(c.run_id)]
        if want is None:
            return  # ``before`` names checkpoints in several namespaces of the run
        keys = [(c.run_id, c.ns, c.checkpoint_id) for c in got]
        assert keys == want, (keys, want)
        for c in got[::-1]:  # oldest first: a copied checkpoint's seq is seen in order
            self.check_checkpoint(c, (c.run_id, c.ns, c.checkpoint_id), with_writes)

    def check_list_runs(self, limit: int | None) -> None:
        infos = self.store.list_runs(limit=limit)
        assert len({r.run_id for r in infos}) == len(infos), infos
        if limit is not None:
            assert len(infos) <= limit, infos
            return
        runs = {r.run_id: r for r in infos if self.ours(r.run_id)}
        assert set(runs) <= {self.p(r) for r in RUNS}, runs
        for run in map(self.p, RUNS):
            keys = self.model.newest_first(k for k in self.model.checkpoints if k[0] == run)
            info = runs.get(run)
            if keys:
                assert info is not None, run
                latest = keys[0]
                assert (info.checkpoints, info.latest_checkpoint_id, info.latest_kind) == (
                    len(keys), latest[2], self.model.checkpoints[latest].kind), info
            elif info is not None:  # all pruned: the run may stay listed, empty
                assert run in self.model.runs, info
                assert (info.checkpoints, info.latest_checkpoint_id) == (0, None), info

    def check_everything(self) -> None:
        """Every checkpoint with its values and writes (the invariants read fewer writes)."""
        got = [c for c in self.store.list_checkpoints(with_writes=True) if self.ours(c.run_id)]
        keys = [(c.run_id, c.ns, c.checkpoint_id) for c in got]
        want = self.model.newest_first(self.model.checkpoints)
        assert keys == want, (keys, want)
        for c, key in zip(got[::-1], keys[::-1], strict=True):
            self.check_checkpoint(c, key, with_writes=True)

    @rule(op=st.sampled_from(("delete_run", "copy_run", "prune_run", "delete_executions")),
          runs=st.permutations(RUNS), keep=st.integers(0, 2),
          executions=st.lists(st.sampled_from(EXECS), min_size=1, unique=True))
    def maintain(self, op: str, runs: list[str], keep: int, executions: list[str]) -> None:
        """delete_run(runs[0]), copy_run(runs[0] -> runs[1]), prune_run(runs[0], keep)
        or delete_executions(executions)."""
        run, other = self.p(runs[0]), self.p(runs[1])
        if op == "delete_run":
            self.store.delete_run(run)
            self.model.delete_run(run)
            self.chunks_collected(run)
        elif op == "copy_run":
            self.store.copy_run(run, other)
            self.model.copy_run(run, other)
            for c in self.model.checkpoints.values():
                if c.seq is None:  # a copy: its seq is above every seq seen so far
                    c.floor = self.max_seq
        elif op == "prune_run":
            self.store.prune_run(run, keep_latest=keep)
            self.model.prune_run(run, keep)
            self.chunks_collected(run)
        else:
            execution_ids = [self.p(e) for e in executions]
            self.store.delete_executions(execution_ids)
            self.model.delete_executions(execution_ids)
        self.check_latest(everywhere=True)  # nothing deleted may still be the latest

    # -------------------------------------------------------- failed writes write nothing

    @rule(run=st.sampled_from(RUNS), ns=st.sampled_from(NSS), cid=st.sampled_from(CIDS),
          how=st.sampled_from(("validate-checkpoint", "serialize-checkpoint",
                               "validate-writes", "serialize-writes")))
    def failed_write(self, run: str, ns: str, cid: str, how: str) -> None:
        run = self.p(run)

        def refuse() -> None:
            raise StateValidationError("refused by the test", run_id=run, step=cid, field="x")

        if how == "validate-checkpoint":
            with pytest.raises(StateValidationError):
                self.store.put_checkpoint(run, cid, ns=ns, new_values={"x": ("9", 1)},
                                          validate=refuse)
        elif how == "serialize-checkpoint":
            with pytest.raises(SerializationError):
                self.store.put_checkpoint(run, cid, ns=ns, data={"ok": 1},
                                          new_values={"x": ("9", 1), "y": ("9", [object()])})
        elif how == "validate-writes":
            with pytest.raises(StateValidationError):
                self.store.put_writes(run, cid, "t0", [(0, "x", 1)], ns=ns, overwrite=True,
                                      validate=refuse)
        else:
            with pytest.raises(SerializationError):
                self.store.put_writes(run, cid, "t0", [(0, "x", 1), (1, "y", object())],
                                      ns=ns, overwrite=True)

    # ---------------------------------------------------------------------------- crashes

    @precondition(lambda self: self.gen < MAX_CRASHES)
    @rule(how=st.sampled_from(("drop", "open-transaction", "killed-writer")))
    def crash(self, how: str) -> None:
        """The process dies: its Store is abandoned unclosed, a new one opens the URL."""
        self.graveyard.append(self.store)  # closed only at teardown (resource hygiene)
        path = getattr(self.store, "path", None)
        if self.backend == "sqlite" and path is not None:
            if how == "killed-writer" and not self.writer_killed:  # once per example: slow
                self.writer_killed = True
                kill_writer_mid_transaction(path)
            elif how != "drop":
                abandon_open_transaction(path)
        self.gen += 1  # every owner of the old process is dead from now on
        self.store = small_chunks(open_store(self.url))
        self.check_everything()
        self.check_latest(everywhere=True)

    # --------------------------------------------------------------------------- receipts

    def _start(self, key: str, owner: str, take: bool, tiny: bool) -> Any:
        run = self.p(RECEIPT_KEYS[key.removeprefix(self.prefix)])
        got = self.store.start_receipt(key, run_id=run, step="s", name=key, ordinal=0,
                                       owner=owner, may_take_over=take,
                                       lease=TINY if tiny else LONG)
        outcome, leased = self.model.start_receipt(key, run, owner, tiny, take)
        assert got.outcome == outcome, (got, self.model.receipts.get(key))
        if leased and tiny:
            self.await_expiry(lambda: self.receipt_lease(key))
        self.check_receipt(got.receipt)
        if outcome in ("run", "taken_over"):
            return multiple((key, owner, got.receipt.fence))
        return multiple()

    @rule(target=receipt_grants, key=st.sampled_from(sorted(RECEIPT_KEYS)),
          who=st.integers(0, OWNERS - 1), take=st.booleans(), tiny=st.booleans())
    def start_receipt(self, key: str, who: int, take: bool, tiny: bool) -> Any:
        return self._start(self.p(key), self.owner(who), take, tiny)

    @precondition(lambda self: self.model.receipts)
    @rule(target=receipt_grants, draw=st.data(), who=st.integers(0, OWNERS - 2),
          take=st.booleans(), tiny=st.booleans())
    def contend_receipt(self, draw: st.DataObject, who: int, take: bool, tiny: bool) -> Any:
        """Another live owner starts a stored receipt (busy, take-over, in doubt, done)."""
        key = draw.draw(st.sampled_from(sorted(self.model.receipts)), label="key")
        others = [o for o in map(self.owner, range(OWNERS))
                  if o != self.model.receipts[key].owner]
        return self._start(key, others[who], take, tiny)

    @rule(grant=receipt_grants)
    def complete_receipt(self, grant: tuple[str, str, int]) -> None:
        key, owner, fence = grant
        result = {"by": owner, "fence": fence}  # one result per grant: a retry repeats it
        if self.model.complete_receipt(key, owner, fence, result):
            self.store.complete_receipt(key, owner=owner, fence=fence, result=result)
        else:
            with pytest.raises(LeaseLost):
                self.store.complete_receipt(key, owner=owner, fence=fence, result=result)

    @rule(grant=receipt_grants, by_hand=st.booleans())
    def release_receipt(self, grant: tuple[str, str, int], by_hand: bool) -> None:
        """The owner releases (fenced), or an operator resets the receipt (unfenced)."""
        key, owner, fence = grant
        if by_hand:
            self.store.reset_receipt(key)
            self.model.receipts.pop(key, None)
        else:
            self.store.release_receipt(key, owner=owner, fence=fence)
            self.model.release_receipt(key, owner, fence)

    @rule(grant=receipt_grants, tiny=st.booleans())
    def renew_receipt(self, grant: tuple[str, str, int], tiny: bool) -> None:
        key, owner, fence = grant
        ok = self.store.renew_receipt(key, owner=owner, fence=fence, lease=TINY if tiny else LONG)
        assert ok == self.model.renew_receipt(key, owner, fence, tiny), grant
        if ok and tiny:
            self.await_expiry(lambda: self.receipt_lease(key))

    # ----------------------------------------------------------------------------- claims

    def _claim(self, key: str, owner: str, digest: str | None, value: Any, tiny: bool) -> Any:
        run = self.p(CLAIM_KEYS[key.removeprefix(self.prefix)])
        before = self.model.claims.get(key)
        outcome, leased = self.model.claim(key, run, owner, tiny, digest, value)

        def claim() -> Claim:
            return self.store.claim_once(key, run_id=run, owner=owner, digest=digest,
                                         value=value, lease=TINY if tiny else LONG)

        if outcome in ("held", "consumed", "mismatch"):
            with pytest.raises(ConsumeConflict) as info:
                claim()
            m = self.model.claims[key]
            assert (info.value.status, info.value.owner) == (m.status, m.owner), (outcome, m)
            assert (info.value.consumed_at is not None) == (outcome == "consumed")
            if outcome == "mismatch":
                assert "another value" in str(info.value)
            return multiple()
        got = claim()
        assert got.taken_over == (outcome == "taken_over"), (outcome, got, before)
        if leased and tiny:
            self.await_expiry(lambda: self.claim_lease(key))
        self.check_claim(got)
        return multiple((key, owner, got.fence))

    @rule(target=claim_grants, key=st.sampled_from(sorted(CLAIM_KEYS)),
          who=st.integers(0, OWNERS - 1), digest=st.sampled_from(DIGESTS),
          value=st.none() | VALUES, tiny=st.booleans())
    def claim_once(self, key: str, who: int, digest: str | None, value: Any, tiny: bool) -> Any:
        return self._claim(self.p(key), self.owner(who), digest, value, tiny)

    @precondition(lambda self: self.model.claims)
    @rule(target=claim_grants, draw=st.data(), who=st.integers(0, OWNERS - 2),
          digest_is=st.sampled_from(("same", "none", "other")), tiny=st.booleans())
    def contend_claim(self, draw: st.DataObject, who: int, digest_is: str, tiny: bool) -> Any:
        """Another live owner claims a stored claim: held, take-over, mismatch, consumed."""
        key = draw.draw(st.sampled_from(sorted(self.model.claims)), label="key")
        m = self.model.claims[key]
        others = [o for o in map(self.owner, range(OWNERS)) if o != m.owner]
        digest = {"same": m.digest, "none": None,
                  "other": "d2" if m.digest == "d1" else "d1"}[digest_is]
        return self._claim(key, others[who], digest, None, tiny)

    @rule(grant=claim_grants, digest=st.sampled_from(DIGESTS))
    def consume_claim(self, grant: tuple[str, str, int], digest: str | None) -> None:
        key, owner, fence = grant
        if self.model.consume_claim(key, owner, fence, digest):
            self.check_claim(self.store.consume_claim(key, owner=owner, fence=fence,
                                                      digest=digest))
        else:
            with pytest.raises(LeaseLost):
                self.store.consume_claim(key, owner=owner, fence=fence, digest=digest)

    @rule(grant=claim_grants)
    def release_claim(self, grant: tuple[str, str, int]) -> None:
        key, owner, fence = grant
        assert self.store.release_claim(key, owner=owner, fence=fence) == \
            self.model.release_claim(key, owner, fence), grant

    @rule(target=claim_grants, grant=claim_grants, digest=st.sampled_from(DIGESTS),
          tiny=st.booleans())
    def redeliver(self, grant: tuple[str, str, int], digest: str | None, tiny: bool) -> Any:
        """The holder gives the claim back and claims it again: the same owner now holds
        a newer fence, and its old grant must be fenced out."""
        key, owner, fence = grant
        assert self.store.release_claim(key, owner=owner, fence=fence) == \
            self.model.release_claim(key, owner, fence), grant
        return self._claim(key, owner, digest, None, tiny)

    @rule(grant=claim_grants, tiny=st.booleans())
    def renew_claim(self, grant: tuple[str, str, int], tiny: bool) -> None:
        key, owner, fence = grant
        ok = self.store.renew_claim(key, owner=owner, fence=fence, lease=TINY if tiny else LONG)
        assert ok == self.model.renew_claim(key, owner, fence, tiny), grant
        if ok and tiny:
            self.await_expiry(lambda: self.claim_lease(key))

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def every_checkpoint_matches(self) -> None:
        got = [c for c in self.store.list_checkpoints(with_writes=False) if self.ours(c.run_id)]
        keys = [(c.run_id, c.ns, c.checkpoint_id) for c in got]
        want = self.model.newest_first(self.model.checkpoints)
        assert keys == want, (keys, want)
        for c, key in zip(got[::-1], keys[::-1], strict=True):  # oldest first: seqs rise
            self.check_checkpoint(c, key, with_writes=False)

    @invariant()
    def latest_per_run_and_ns_matches(self) -> None:
        self.check_latest(everywhere=False)

    def check_latest(self, *, everywhere: bool) -> None:
        """get_checkpoint(run, ns=ns) is the model's latest, for every (run, ns) that has
        checkpoints, and (``everywhere``, after deletions and crashes) None for the others.
        Writes are read when the model has some; a stray write shows in the usage counts."""
        for run in map(self.p, RUNS):
            for ns in NSS:
                key = self.model.latest(run, ns)
                if key is None and not everywhere:
                    continue
                with_writes = key is not None and bool(self.model.writes_of(key))
                got = self.store.get_checkpoint(run, ns=ns, with_writes=with_writes)
                if key is None:
                    assert got is None, got
                else:
                    assert got is not None, key
                    self.check_checkpoint(got, key, with_writes=with_writes)

    @invariant()
    def every_receipt_matches(self) -> None:
        got = {r.key: r for r in self.store.list_receipts() if self.ours(r.key)}
        assert set(got) == set(self.model.receipts), (sorted(got), sorted(self.model.receipts))
        for r in got.values():
            self.check_receipt(r)

    @invariant()
    def every_claim_matches(self) -> None:
        got = {c.key: c for c in self.store.list_claims() if self.ours(c.key)}
        assert set(got) == set(self.model.claims), (sorted(got), sorted(self.model.claims))
        for c in got.values():
            self.check_claim(c)

    @invariant()
    def usage_matches(self) -> None:
        got = self.usage_counts()
        mine = {k: v - self.baseline[k] for k, v in got.items()}
        assert mine == self.model.usage(), (got, self.baseline, self.model.usage())


def test_store_matches_model(backend: str, store_url: str) -> None:
    with open_store(store_url) as store:
        run_state_machine_as_test(lambda: StoreMachine(store_url, backend, store),
                                  settings=SETTINGS)


def test_model_decision_tables() -> None:
    """The model itself follows the decision tables (a direct check, no store)."""
    model = Model()
    assert model.start_receipt("k", "r", "a", True, False) == ("run", True)
    assert model.start_receipt("k", "r", "b", False, False) == ("in_doubt", False)
    assert model.start_receipt("k", "r", "b", False, True) == ("taken_over", True)
    assert model.start_receipt("k", "r", "a", False, True) == ("busy", False)
    assert not model.complete_receipt("k", "a", 1, "late")
    assert model.complete_receipt("k", "b", 2, "ok")
    assert model.start_receipt("k", "r", "c", False, True) == ("done", False)
    assert model.claim("g", "r", "a", True, "d1", 1) == ("won", True)
    assert model.claim("g", "r", "a", True, "d2", 2) == ("reentered", False)
    assert model.claim("g", "r", "b", False, "d2", 2) == ("mismatch", False)
    assert model.claim("g", "r", "b", False, None, None) == ("taken_over", True)
    assert model.claims["g"].value == 1 and model.claims["g"].fence == 2
    assert model.claim("g", "r", "c", False, None, None) == ("held", False)
    assert not model.consume_claim("g", "a", 1, None)
    assert model.consume_claim("g", "b", 2, None) and model.claims["g"].digest == "d1"
    assert model.claim("g", "r", "c", False, None, None) == ("consumed", False)


# =================================================== the decision functions, on every backend
#
# Every backend decides as the pure functions of ``remit_core.store.decisions``. The SQL
# backends call those functions; the Redis backend runs the same decision tables
# in its Lua scripts. For every combination of the facts a decision depends on -- the
# stored record (none, or each status, lease live or expired, digest and value set or
# not), the caller (the holder, another owner, an older or newer fence) and the request
# (each operation, with each kind of digest and value) -- the test writes the record
# straight into the backend, runs the backend's primitive (``_start_receipt``, ``_claim``,
# ``_consume_claim``, ``_renew_claim`` ...) and checks that its outcome, the record it
# returns and the record it leaves stored are those of the pure function's verdict, on
# SQLite, on PostgreSQL and on a real Redis.
#
# The combinations are enumerated, not sampled: a random draw reaches a branch that needs
# five facts at once (the holder consumes a claimed record with a digest, giving none)
# in too few runs. Leases are set far from the clock (expired 1000 s ago, or running for
# 1000 s more), so that no outcome depends on when the server reads its clock; the times
# a verdict writes (``now + lease``, ``now``) are compared to the test's clock within a
# second.

TIMES = ("lease_until", "started_at", "completed_at", "claimed_at", "consumed_at",
         "updated_at")
FAR = 1000.0  # seconds between a stored lease's end and now
HOLDER, FENCE = "a", 2  # the stored record's owner and fence
CALLERS = list(itertools.product(["a", "b"], [1, 2, 3]))  # (owner, fence): older, same, newer


# ------------------------------------------------------------------- the record, stored raw


def _redis_fields(row: ReceiptRow | ClaimRow | RunRow) -> dict[str, Any]:
    """A record as the Lua scripts store it: times with six decimals, None left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(row):
        v = getattr(row, f.name)
        if v is None or f.name == "previous_owner":
            continue
        out[f.name] = f"{v:.6f}" if f.name in TIMES else v
    return out


Kind = str  # "receipt", "claim" or "run": which record table


def read_raw(store: Store, kind: Kind) -> Callable[[str], Any]:
    """How the backend reads a record of ``kind`` (a run: its row, without the clock)."""
    if kind == "receipt":
        return store._get_receipt
    if kind == "claim":
        return store._get_claim

    def run(key: str) -> Any:
        found = store._get_run(key)
        return None if found is None else found[0]
    return run


def store_raw(store: Store, key: str, row: ReceiptRow | ClaimRow | RunRow | None, *,
              kind: Kind) -> Any:
    """Put ``row`` as record ``key`` behind the backend's back (or none), and return it as
    the backend reads it back."""
    if isinstance(store, RedisStore):
        name = {"receipt": store._k.rc, "claim": store._k.cl, "run": store._k.lc}[kind](key)
        store._redis.delete(name)
        if row is not None:
            store._redis.hset(name, mapping=_redis_fields(row))  # type: ignore[arg-type]
    else:
        assert isinstance(store, SqlStore)
        records: Any = {"receipt": store._receipts, "claim": store._claims,
                        "run": store._lifecycle}[kind]
        with store._writing() as conn:
            conn.execute(records.delete, {"key": key})
            if row is not None:
                SqlStore._apply(conn, records, Verdict(None, row, "insert"))
    return read_raw(store, kind)(key)


def alike(got: Any, want: Any, *, took: float = 0.0) -> bool:
    """Equal records, times within a second of each other plus ``took``, the seconds the
    backend's call took (the backend read its own clock at some moment of that call)."""
    if got is None or want is None:
        return got is want
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if f.name in TIMES and a is not None and b is not None:
            if abs(a - b) > 1.0 + took:
                return False
        elif a != b:
            return False
    return True


def left_stored(cur: Any, verdict: Verdict[Any, Any]) -> Any:
    """What the verdict leaves in the store."""
    if verdict.write == "delete":
        return None
    if verdict.write == "none":
        return cur
    return dataclasses.replace(verdict.row, previous_owner=None)  # previous_owner: not stored


Case = tuple[str, Any, Callable[[str, Any, float], Verdict[Any, Any]], Callable[[str], Any]]


def check_all(store: Store, stored: list[Any], requests: list[Case], *, kind: Kind) -> int:
    """Run every request on every stored record; fail with the first mismatches. Returns
    the number of cases."""
    read = read_raw(store, kind)
    failures: list[str] = []
    n = 0
    for make, (what, request, decide, call) in itertools.product(stored, requests):
        n += 1
        key = f"{kind[0]}-{uuid.uuid4().hex[:10]}"
        cur = store_raw(store, key, make(key, time.time()), kind=kind)
        before = time.time()
        want = decide(key, cur, before)
        got = call(key)
        took = time.time() - before  # a loaded machine can pause between decide and call
        outcome, row = got[:2] if isinstance(got, tuple) else (got, None)
        returned_ok = not isinstance(got, tuple) or alike(row, want.row, took=took)
        left = read(key)
        if (outcome != want.outcome or not returned_ok
                or not alike(left, left_stored(cur, want), took=took)):
            failures.append(f"{what} {request} on {cur}:\n  backend: {got}, stored {left}"
                            f"\n  decided: {want}")
    assert not failures, f"{len(failures)} of {n} cases differ:\n" + "\n".join(failures[:5])
    return n


# ---------------------------------------------------------------------------------- receipts


def stored_receipts() -> Iterator[Callable[[str, float], ReceiptRow | None]]:
    yield lambda key, now: None
    for status, live in itertools.product(["started", "completed"], [True, False]):
        def make(key: str, now: float, status: str = status, live: bool = live) -> ReceiptRow:
            done = status == "completed"
            return ReceiptRow(key, "r", "s", "n", 0,
                              status, HOLDER, FENCE,  # type: ignore[arg-type]
                              now + (FAR if live else -FAR), now - 2 * FAR,
                              now - FAR if done else None, b"\x01stored" if done else None, 2)
        yield make


LEASE = 5.0
RESULT = b"\x01done"


def change_case(what: str, change: decisions.Change, owner: str, fence: int,
                call: Callable[[str], bool]) -> Case:
    def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
        return decisions.apply(change, cur, owner=owner, fence=fence, now=now, lease=LEASE,
                               result=RESULT)

    return what, (owner, fence), decide, call


def receipt_requests(store: Store) -> Iterator[Case]:
    def start(owner: str, take: bool) -> Case:
        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.start_receipt(cur, key=key, run_id="r", step="s", name="n",
                                           ordinal=0, owner=owner, lease=LEASE,
                                           may_take_over=take, now=now)

        def call(key: str) -> Any:
            return store._start_receipt(key, "r", "s", "n", 0, owner, LEASE, take)

        return "start_receipt", (owner, take), decide, call

    def fenced(owner: str, fence: int) -> Iterator[Case]:
        yield change_case("complete", decisions.COMPLETE_RECEIPT, owner, fence,
                          lambda key: store._complete_receipt(key, owner, fence, RESULT))
        yield change_case("release", decisions.RELEASE_RECEIPT, owner, fence,
                          lambda key: store._release_receipt(key, owner, fence))
        yield change_case("renew", decisions.RENEW_RECEIPT, owner, fence,
                          lambda key: store._renew_receipt(key, owner, fence, LEASE))
        yield change_case("resolve", decisions.RESOLVE_RECEIPT, owner, fence,
                          lambda key: store._resolve_receipt(key, RESULT))

    for owner, fence in CALLERS:
        yield start(owner, True)
        yield start(owner, False)
        yield from fenced(owner, fence)


def test_receipts_decide_as_the_pure_functions(store: Store) -> None:
    n = check_all(store, list(stored_receipts()), list(receipt_requests(store)), kind="receipt")
    assert n == 5 * 36


# ------------------------------------------------------------------------------------ claims


def stored_claims() -> Iterator[Callable[[str, float], ClaimRow | None]]:
    yield lambda key, now: None
    for status, live, digest, value in itertools.product(
            ["claimed", "consumed", "released"], [True, False], [None, "d1"], [None, b"\x01v1"]):
        def make(key: str, now: float, status: str = status, live: bool = live,
                 digest: str | None = digest, value: bytes | None = value) -> ClaimRow:
            return ClaimRow(key, "r", status, HOLDER, FENCE,  # type: ignore[arg-type]
                            now + (FAR if live else -FAR), digest, value, now - 2 * FAR,
                            now - FAR if status == "consumed" else None)
        yield make


def claim_requests(store: Store) -> Iterator[Case]:
    def claim(owner: str, digest: str | None, value: bytes | None) -> Case:
        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.claim(cur, key=key, run_id="r", owner=owner, lease=LEASE,
                                   digest=digest, value=value, now=now)

        def call(key: str) -> Any:
            return store._claim(key, "r", owner, LEASE, digest, value)

        return "claim", (owner, digest, value), decide, call

    def consume(owner: str, fence: int, digest: str | None) -> Case:
        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.consume_claim(cur, owner=owner, fence=fence, digest=digest,
                                           now=now)

        def call(key: str) -> Any:
            return store._consume_claim(key, owner, fence, digest)

        return "consume", (owner, fence, digest), decide, call

    def fenced(owner: str, fence: int) -> Iterator[Case]:
        yield change_case("release", decisions.RELEASE_CLAIM, owner, fence,
                          lambda key: store._release_claim(key, owner, fence))
        yield change_case("renew", decisions.RENEW_CLAIM, owner, fence,
                          lambda key: store._renew_claim(key, owner, fence, LEASE))

    for owner, fence in CALLERS:
        for digest, value in itertools.product([None, "d1", "d2"], [None, b"\x01v2"]):
            yield claim(owner, digest, value)
        for digest in (None, "d1", "d2"):
            yield consume(owner, fence, digest)
        yield from fenced(owner, fence)


def test_claims_decide_as_the_pure_functions(store: Store) -> None:
    n = check_all(store, list(stored_claims()), list(claim_requests(store)), kind="claim")
    assert n == 25 * 66


# --------------------------------------------------------------------------------- lifecycle


def stored_runs() -> Iterator[Callable[[str, float], RunRow | None]]:
    yield lambda key, now: None
    for status, live in itertools.product(
            ["running", "parked", "done", "failed", "needs-attention"], [True, False]):
        if status != "running" and live:
            continue  # (only a running run has a lease)

        def make(key: str, now: float, status: str = status, live: bool = live) -> RunRow:
            running = status == "running"
            return RunRow(key, key, "fw", "old-name", status,  # type: ignore[arg-type]
                          HOLDER if running else None, FENCE,
                          now + FAR if live else (now - FAR if running else 0.0),
                          b"\x01wait" if status in ("parked", "needs-attention") else None,
                          b"\x01boom" if status == "failed" else None, 3, now - 3 * FAR,
                          now - 2 * FAR)
        yield make


#: a plain start, and recoveries: of abandoned runs only, also retaking failed and
#: needs-attention ones, with attempts left (the stored runs have had 3) and spent
RECOVERIES = [None, Recovery(), Recovery(("failed", "needs-attention"), 5, None),
              Recovery(("failed",), 3, b"\x01spent"), Recovery(("needs-attention",), 2, None)]


def run_requests(store: Store) -> Iterator[Case]:
    def start(owner: str, recovery: Recovery | None, likely_new: bool = False) -> Case:
        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.start_run(cur, run_id=key, framework="fw2", name="graph",
                                       owner=owner, lease=LEASE, recovery=recovery,
                                       now=now)

        def call(key: str) -> Any:  # (likely_new: a hint, the same decision either way)
            return store._start_run(key, "fw2", "graph", owner, LEASE, recovery, likely_new)

        return "start_run", (owner, recovery, likely_new), decide, call

    def end(owner: str, fence: int, status: str) -> Case:
        detail = {"parked": b"\x01w2", "failed": b"\x01e2",
                  "needs-attention": b"\x01k2"}.get(status)

        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.end_run(cur, owner=owner, fence=fence,
                                     status=status, detail=detail,  # type: ignore[arg-type]
                                     now=now)

        def call(key: str) -> Any:
            return store._end_run(key, owner, fence, status, detail)  # type: ignore[arg-type]

        return "end_run", (owner, fence, status), decide, call

    def renew(owner: str, fence: int) -> Case:
        return change_case("renew", decisions.RENEW_RUN, owner, fence,
                           lambda key: store._renew_run(key, owner, fence, LEASE))

    def imported(status: str, replacing: str = "") -> Case:
        """``replacing``: "" (a first import), "same" (replaces the stored record as read)
        or "stale" (replaces one with another fence: it changed since it was read)."""
        detail = {"parked": b"\x01w3", "failed": b"\x01e3",
                  "needs-attention": b"\x01k3"}.get(status)

        def replaces(cur: RunRow | None) -> tuple[int, float] | None:
            if not replacing or cur is None:
                return (1, 0.0) if replacing else None
            return (cur.fence + (replacing == "stale"), cur.updated_at)

        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.import_run(cur, run_id=key, framework="fw3", name="stock",
                                        status=status,  # type: ignore[arg-type]
                                        owner="migrate:x", detail=detail, now=now,
                                        replaces=replaces(cur))

        def call(key: str) -> Any:
            got = store._get_run(key)
            return store._import_run(key, "fw3", "stock", status,  # type: ignore[arg-type]
                                     "migrate:x", detail, replaces(got and got[0]))

        return "import_run", (status, replacing), decide, call

    for owner, fence in CALLERS:
        for recovery in RECOVERIES:
            yield start(owner, recovery)
        yield start(owner, None, likely_new=True)
        for status in ("parked", "done", "failed", "needs-attention"):
            yield end(owner, fence, status)
        yield renew(owner, fence)
    for status in ("abandoned", "parked", "done", "failed", "needs-attention"):
        for replacing in ("", "same", "stale"):
            yield imported(status, replacing)


def test_runs_decide_as_the_pure_functions(store: Store) -> None:
    """The run lifecycle's decisions, on every backend (the Redis one in Lua), are those
    of remit_core.store.decisions, on every stored record and request."""
    n = check_all(store, list(stored_runs()), list(run_requests(store)), kind="run")
    assert n == 7 * 81  # 6 callers x (5 starts, 1 likely_new, 4 ends, 1 renewal) + 15 imports


#: the recoveries of a batch take (it retakes no stored status): attempts unbounded, left
#: (the stored runs have had 3) and spent
TAKES = [Recovery(), Recovery((), 5, None), Recovery((), 3, b"\x01spent")]


def test_a_batch_take_decides_each_run_as_the_pure_function(store: Store) -> None:
    """``Store.take_runs`` (the Redis one in Lua) takes a run exactly where
    decisions.start_run, recovering, takes it over or records it exhausted, and leaves it
    as that decision does; every other run (live, parked, finished, the caller's own) it
    passes over untouched. Each case is a framework of its own, so a take sees its run
    only."""
    read = read_raw(store, "run")
    failures: list[str] = []
    n = took = 0
    for make, recovery, owner in itertools.product(stored_runs(), TAKES, ["a", "b"]):
        n += 1
        key, framework = f"r-{uuid.uuid4().hex[:10]}", f"fw-{uuid.uuid4().hex[:8]}"
        made = make(key, time.time())
        row = None if made is None else dataclasses.replace(made, framework=framework)
        cur = store_raw(store, key, row, kind="run")
        if isinstance(store, RedisStore) and row is not None and row.status == "running":
            store._redis.zadd(store._k.lcl, {key: row.lease_until})  # as the scripts index it
        before = time.time()
        want = decisions.start_run(cur, run_id=key, framework="", name="", owner=owner,
                                   lease=LEASE, recovery=recovery, now=before)
        takes = want.outcome in ("taken_over", "exhausted") and want.write == "update"
        took += takes
        got = store._take_runs(framework, None, owner, LEASE, recovery, 3)
        spent = time.time() - before
        returned_ok = (len(got) == 1 and got[0][0] == want.outcome
                       and alike(got[0][1], want.row, took=spent)) if takes else got == []
        left = read(key)
        if not returned_ok or not alike(left, left_stored(cur, want) if takes else cur,
                                        took=spent):
            failures.append(f"take by {owner} {recovery} on {cur}:\n  backend: {got}, "
                            f"stored {left}\n  decided: {want}")
    assert not failures, f"{len(failures)} of {n} cases differ:\n" + "\n".join(failures[:5])
    # an expired run of another owner, under each recovery: two taken over, one exhausted
    assert (n, took) == (7 * 3 * 2, 3)
