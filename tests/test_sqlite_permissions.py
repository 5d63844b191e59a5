"""SQLite files are created owner-only; permission problems are reported as such
(issue 13, item 11).

The database file and its -wal and -shm files are 0600 unless the URL says otherwise
(``?mode=0640``). A directory or file the process may not write gives a message about
permissions, not "is it a SQLite database?". Root bypasses permission checks, so those
cases run in a child process that drops to the ``nobody`` user when the tests run as root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from remit_core import open_store
from remit_core.errors import StoreConfigError


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(path: Path) -> dict[str, int]:
    return {suffix: stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode)
            for suffix in ("", "-wal", "-shm")}


def test_files_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with umask(0o022), open_store(f"sqlite:///{path}") as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
        assert modes(path) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}


def test_the_url_can_say_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with umask(0o077), open_store(f"sqlite:///{path}?mode=0640") as s:
        s.put_checkpoint("r", "c1")
        assert modes(path) == {"": 0o640, "-wal": 0o640, "-shm": 0o640}


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}") as s:
        s.put_checkpoint("r", "c1")
    path.chmod(0o660)
    with open_store(f"sqlite:///{path}") as s:
        s.put_checkpoint("r", "c2", parent_id="c1")
        assert modes(path)[""] == 0o660


def test_a_mode_the_owner_cannot_use_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError, match=r"option mode='0444'.*owner"):
        open_store(f"sqlite:///{tmp_path}/s.db?mode=0444")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError, match="does not exist") as info:
        open_store(f"sqlite:///{tmp_path}/nope/s.db")
    assert "Is it a SQLite database" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------- read-only directories and files (as nobody)

CHILD = """
import os, sys, tempfile
from remit_core import open_store
from remit_core.errors import RemitError

# warm up as the starting user: the interpreter's own files may not be readable by the
# user this child becomes (a lazy import after the switch would fail)
with tempfile.TemporaryDirectory() as warm:
    open_store(f"sqlite:///{warm}/w.db").close()
    try:
        open_store(f"sqlite:///{warm}/missing/w.db")
    except RemitError:
        pass
uid, gid = int(sys.argv[2]), int(sys.argv[3])
if uid >= 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
try:
    open_store(sys.argv[1]).close()
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
else:
    print("opened")
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the unprivileged user can enter and read but not write."""
    d = Path(tempfile.mkdtemp(prefix="remit-perm-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_unprivileged(url: str, d: Path) -> str:
    """Open ``url`` in a child that cannot write ``d``; returns what it printed. As root,
    the child drops to ``nobody`` (root may write anywhere); otherwise ``d`` is made
    read-only for the length of the call."""
    uid = gid = -1
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
    else:
        d.chmod(0o555)
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, url, str(uid), str(gid)],
                              capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        d.chmod(0o755)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_read_only_directory_is_a_permission_problem(shared_dir: Path) -> None:
    out = as_unprivileged(f"sqlite:///{shared_dir}/new.db", shared_dir)
    assert out.startswith("StoreUnavailable"), out
    assert "permission" in out.lower() and str(shared_dir) in out, out
    assert "Is it a SQLite database" not in out, out
    assert list(shared_dir.iterdir()) == []


def test_a_read_only_file_is_a_permission_problem(shared_dir: Path) -> None:
    path = shared_dir / "s.db"
    with open_store(f"sqlite:///{path}?mode=0644") as s:
        s.put_checkpoint("r", "c1")
    if os.geteuid() != 0:
        path.chmod(0o444)
    before = sorted(p.name for p in shared_dir.iterdir())
    out = as_unprivileged(f"sqlite:///{path}", shared_dir)
    assert out.startswith("StoreUnavailable"), out
    assert "permission" in out.lower() and "read-only" in out, out
    assert "Is it a SQLite database" not in out, out
    assert sorted(p.name for p in shared_dir.iterdir()) == before
