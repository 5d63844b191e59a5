"""The resume race and the recovery race between two hosts, each with its own address.

The module makes two hosts on this machine: two network namespaces, each joined to the
root namespace by a veth pair (a /30 of its own: the host side ``.1``, the namespace side
``.2``), and a private PostgreSQL (initdb in a temporary folder, run as the ``postgres``
OS user) that listens on the two host-side veth addresses only; the shared server
listens on loopback, where the namespaces cannot reach it. A process in a namespace
reaches the store through its veth, from its own address, as another machine would (each
test checks in the server's log that connections came from both namespace addresses).
All of it is removed at the end, also when a test fails. The module is skipped, with a
one-line reason, only where ``ip netns add`` is not permitted (not root); any other
failure to set the hosts up fails.

In each namespace one process imports the frameworks once and forks its children
(tests/cross_host_workers.py); all children of both hosts are released together, round by
round, by a barrier of files (no sleeps).

* Resume: ten threads are parked on the interrupt in ``b``; in round ``i`` four racers on
  each host resume thread ``i`` with ``Command(resume={...})`` at once. Exactly one wins
  each round (the graph ran on with its value), the seven others are refused with
  ``ConsumeConflict``; the ledger shows ``b`` re-entered and ``c`` entered once per
  round, by the winner's process, and the effect in ``b`` fired once.
  ``REMIT_TEST_BREAK=langgraph-gate`` (the consume-once gate off) makes it fail.
* Recovery: forty threads are SIGKILLed inside ``c`` (tests/langgraph/test_recovery.py's
  ``kill_in_c``); once they read as abandoned, three recoverers on each host call
  ``recover`` at once. Every thread is recovered exactly once over both hosts, its effect
  fired once, ``a`` and ``b`` did not run again. ``REMIT_TEST_BREAK=recovery`` (the
  atomic take off) makes it fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from remit_core.adapter import poll
from remit_langgraph import RemitSaver
from tests.cross_host_workers import thread_of
from tests.langgraph import lg_recovery_workers as w
from tests.langgraph.test_recovery import check_once, kill_in_c, ledger_lines

REPO = Path(__file__).resolve().parents[1]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
#: racers per host and rounds of the resume race; recoverers per host and threads
RACERS, ROUNDS = 4, 10
RECOVERERS, THREADS = 3, 40
WAIT = 120.0


def run(*cmd: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a set-up or tear-down command; fail with its own words if it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


def as_postgres(*cmd: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return run("runuser", "-u", "postgres", "--", *cmd, cwd=cwd)


@dataclass
class Hosts:
    names: list[str]  # the network namespaces
    host_ips: list[str]  # the root namespace's end of each veth: the server listens there
    ns_ips: list[str]  # each namespace's own address
    port: int
    log: Path  # the server's log (log_connections = on)

    def connections(self) -> Counter[str]:
        """How many connections the server received so far, by the client's address."""
        return Counter(re.findall(r"connection received: host=([0-9.]+)",
                                  self.log.read_text(errors="replace")))

    def url(self, host: int, schema: str) -> str:
        """The store as seen from namespace ``host`` (the test itself uses host 0's)."""
        return f"postgresql://postgres@{self.host_ips[host]}:{self.port}/remit?schema={schema}"


def _free_subnet() -> int:
    """A third octet ``n`` with no address of this machine in 10.213.n.0/24."""
    used = run("ip", "-o", "-4", "addr", "show").stdout
    free = [n for n in range(1, 255) if f" 10.213.{n}." not in used]
    return random.choice(free)


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _add_namespace(name: str) -> None:
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        if "not permitted" in said or "Permission denied" in said:
            pytest.skip(f"ip netns add is not permitted here: {said}")
        raise RuntimeError(f"ip netns add {name} exited {done.returncode}: {said}")


def _start_postgres(stack: contextlib.ExitStack, listen: list[str], subnets: list[str],
                    ) -> tuple[int, Path]:
    folder = tempfile.mkdtemp(prefix="remit-xhost-pg-")
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    shutil.chown(folder, "postgres", "postgres")
    data = os.path.join(folder, "data")
    as_postgres(str(PG_BIN / "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
                "-E", "UTF8", "--no-sync", cwd=folder)
    port = _free_port(listen[0])
    with open(os.path.join(data, "postgresql.conf"), "a") as conf:
        conf.write(f"listen_addresses = '{','.join(listen)}'\n"
                   f"port = {port}\n"
                   f"unix_socket_directories = '{folder}'\n"
                   "max_connections = 300\n"
                   "log_connections = on\n"
                   "fsync = off\n")  # a throw-away server: nothing here outlives a crash
    with open(os.path.join(data, "pg_hba.conf"), "w") as hba:
        hba.write("local all all trust\n")
        hba.writelines(f"host all all {subnet} trust\n" for subnet in subnets)
    as_postgres(str(PG_BIN / "pg_ctl"), "-D", data, "-l", os.path.join(folder, "log"),
                "-w", "-t", "60", "start", cwd=folder)
    stack.callback(as_postgres, str(PG_BIN / "pg_ctl"), "-D", data, "-m", "fast", "-w",
                   "stop", cwd=folder)
    return port, Path(folder, "log")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    import psycopg

    tag = os.getpid()
    names = [f"remit-h1-{tag}", f"remit-h2-{tag}"]
    with contextlib.ExitStack() as stack:
        n = _free_subnet()
        host_ips, ns_ips, subnets = [], [], []
        for i, ns in enumerate(names):
            _add_namespace(ns)
            stack.callback(run, "ip", "netns", "del", ns)
            outside, inside = f"rx{tag}h{i}", f"rx{tag}n{i}"
            base = 4 * i  # 10.213.n.0/30 and 10.213.n.4/30
            run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside,
                "netns", ns)
            # deleting the host end removes both ends at once (a namespace is freed later)
            stack.callback(run, "ip", "link", "del", outside)
            run("ip", "addr", "add", f"10.213.{n}.{base + 1}/30", "dev", outside)
            run("ip", "link", "set", outside, "up")
            run("ip", "-n", ns, "addr", "add", f"10.213.{n}.{base + 2}/30", "dev", inside)
            run("ip", "-n", ns, "link", "set", inside, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            host_ips.append(f"10.213.{n}.{base + 1}")
            ns_ips.append(f"10.213.{n}.{base + 2}")
            subnets.append(f"10.213.{n}.{base}/30")
        port, log = _start_postgres(stack, host_ips, subnets)
        with psycopg.connect(f"postgresql://postgres@{host_ips[0]}:{port}/postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute("CREATE DATABASE remit")
        yield Hosts(names, host_ips, ns_ips, port, log)


# ------------------------------------------------------------------------------- helpers


def start(hosts: Hosts, role: str, schema: str, ledger: Path, folder: Path, count: int,
          *extra: str) -> list[subprocess.Popen[bytes]]:
    """One process per namespace; it forks ``count`` children named ``h<host>-<n>``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    procs = []
    for i, ns in enumerate(hosts.names):
        out = open(folder / f"h{i + 1}.log", "wb")  # noqa: SIM115 (closed below)
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.cross_host_workers",
             role, "--url", hosts.url(i, schema), "--ledger", str(ledger), "--dir",
             str(folder), "--host", f"h{i + 1}", "--count", str(count), *extra],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True))  # its own process group: its children go with it
        out.close()
    return procs


def check_alive(procs: list[subprocess.Popen[bytes]], folder: Path) -> None:
    for i, p in enumerate(procs):
        if p.poll() not in (None, 0):
            log = (folder / f"h{i + 1}.log").read_text(errors="replace")
            raise AssertionError(f"host h{i + 1}'s process exited with {p.returncode}:\n"
                                 f"{log[-4000:]}")


def release(procs: list[subprocess.Popen[bytes]], folder: Path, round_no: int,
            names: list[str]) -> None:
    """Wait until every child of both hosts is ready for the round, then let them go."""
    def all_ready() -> bool | None:
        check_alive(procs, folder)
        return True if all((folder / f"ready-{round_no}-{n}").exists()
                           for n in names) else None

    assert poll(all_ready, within=WAIT, pause=0.002, most=0.02), \
        f"round {round_no}: not every child got ready"
    (folder / f"go-{round_no}").touch()


def finish(procs: list[subprocess.Popen[bytes]], folder: Path) -> None:
    try:
        for p in procs:
            p.wait(timeout=WAIT)
        check_alive(procs, folder)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def results(folder: Path, round_no: int, names: list[str]) -> dict[str, Any]:
    return {n: json.loads((folder / f"result-{round_no}-{n}.json").read_text())
            for n in names}


def children(count: int) -> list[str]:
    return [f"h{h}-{n}" for h in (1, 2) for n in range(count)]


# --------------------------------------------------------------------------------- tests


def test_k_racers_on_two_hosts_resume_each_round_once(hosts: Hosts, tmp_path: Path) -> None:
    url = hosts.url(0, "xh_resume")
    ledger, folder = tmp_path / "ledger", tmp_path / "barrier"
    folder.mkdir()
    threads = [thread_of(i) for i in range(ROUNDS)]
    with RemitSaver.from_conn_string(url) as saver:
        graph = w.app(saver, str(ledger), park_in_b=True)
        for t in threads:
            assert "__interrupt__" in graph.invoke({"thread": t}, w.cfg(t))
    names = children(RACERS)
    before = hosts.connections()
    procs = start(hosts, "race", "xh_resume", ledger, folder, RACERS,
                  "--rounds", str(ROUNDS))
    try:
        for i in range(ROUNDS):
            release(procs, folder, i, names)
    finally:
        finish(procs, folder)
    came = hosts.connections() - before
    assert all(came[ip] for ip in hosts.ns_ips), f"connections by address: {came}"
    rounds = [results(folder, i, names) for i in range(ROUNDS)]
    verdicts = {i: Counter(r["verdict"] for r in got.values()) for i, got in enumerate(rounds)}
    bad = {i: dict(c) for i, c in verdicts.items()
           if c != Counter(won=1, refused=2 * RACERS - 1)}
    assert not bad, f"rounds without exactly one winner: {bad}"
    lines = ledger_lines(ledger)
    counts = Counter(" ".join(line.split()[:3]) for line in lines)
    with RemitSaver.from_conn_string(url) as saver:
        graph = w.app(saver, os.devnull, park_in_b=True)
        for i, got in enumerate(rounds):
            t = thread_of(i)
            (winner,) = [r for r in got.values() if r["verdict"] == "won"]
            assert winner["answer"] == winner["value"] and winner["log"][-1] == "c"
            # a refused racer names the one who holds or consumed the resume, if anyone
            assert len({r["owner"] for r in got.values() if r["verdict"] == "refused"}
                       - {None}) <= 1, got
            state = graph.get_state(w.cfg(t))
            assert state.values["answer"] == winner["value"] and not state.next
            # b: entered to park and once more by the one resume; c: by the winner alone
            assert (counts[f"enter a {t}"], counts[f"enter b {t}"],
                    counts[f"effect charge {t}"]) == (1, 2, 1), lines
            assert [x.split()[-1] for x in lines if x.startswith(f"enter c {t} ")] == \
                [str(winner["pid"])], lines


def test_recoverers_on_two_hosts_take_each_abandoned_thread_once(hosts: Hosts,
                                                                 tmp_path: Path) -> None:
    url = hosts.url(0, "xh_recover")
    ledger, folder = tmp_path / "ledger", tmp_path / "barrier"
    folder.mkdir()
    threads = [f"r{i:02d}" for i in range(THREADS)]
    kill_in_c(url, ledger, threads)
    names = children(RECOVERERS)
    before = hosts.connections()
    procs = start(hosts, "recover", "xh_recover", ledger, folder, RECOVERERS)
    try:
        release(procs, folder, 0, names)
    finally:
        finish(procs, folder)
    came = hosts.connections() - before
    assert all(came[ip] for ip in hosts.ns_ips), f"connections by address: {came}"
    reports = results(folder, 0, names)  # name -> [pid, recovered, failed, skipped]
    assert all(not failed for _, _, failed, _ in reports.values()), reports
    recovered = Counter(t for _, done, _, _ in reports.values() for t in done)
    assert recovered == Counter({t: 1 for t in threads}), recovered
    check_once(ledger, threads)
