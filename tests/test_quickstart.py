"""The README's first command, and scripts/test's own uv bootstrap, work on a Python whose
pip refuses installs as Debian's and Ubuntu's system Pythons do (PEP 668,
``externally-managed-environment``).

The setting is a throwaway Python prefix, not a virtualenv (pip ignores the marker in a
virtualenv): the running interpreter with ``PYTHONHOME`` pointing at a directory whose
``lib/pythonX.Y`` links to the real standard library, pip installed into it by
``ensurepip``, then an ``EXTERNALLY-MANAGED`` file in that stdlib directory. User installs
go to a temporary ``PYTHONUSERBASE``; nothing outside the test's directory changes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def quick_start_command() -> str:
    """The first ``sh`` block under the README's "Quick start" heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)\n```", section, flags=re.S)
    assert found, "the Quick start has no sh block"
    return found.group(1).strip()


@pytest.fixture(scope="module")
def managed_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``python3`` (a two-line wrapper) whose pip refuses installs: PEP 668's marker."""
    base = Path(sys.base_prefix)
    stdlib = base / "lib" / VERSION
    interpreter = base / "bin" / VERSION
    if not (stdlib / "os.py").is_file() or not interpreter.is_file():
        pytest.skip(f"no {VERSION} prefix layout under {base}")
    prefix = tmp_path_factory.mktemp("managed-python")
    lib = prefix / "lib" / VERSION
    lib.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    (lib / "site-packages").mkdir()
    (prefix / "bin").mkdir()
    python3 = prefix / "bin" / "python3"
    python3.write_text(f'#!/bin/sh\nPYTHONHOME="{prefix}" exec "{interpreter}" "$@"\n')
    python3.chmod(0o755)
    made = subprocess.run([str(python3), "-m", "ensurepip"], capture_output=True, text=True,
                          timeout=120, env=_env(prefix / "no-user-base"))
    if made.returncode != 0:
        pytest.skip(f"ensurepip is not available: {made.stderr.strip()[-200:]}")
    (lib / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=This Python is managed by the system (a test marker, "
        "as Debian's).\n")
    refused = subprocess.run([str(python3), "-m", "pip", "install", "uv"], capture_output=True,
                             text=True, timeout=120, env=_env(prefix / "no-user-base"))
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr, (
        "the marker must make pip refuse, as on Debian: " + refused.stderr[-500:])
    return python3


def _env(user_base: Path, **extra: str) -> dict[str, str]:
    """This environment without what points at a Python or a uv of its own (the test
    process runs in the project's virtualenv), user installs into ``user_base``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VIRTUAL_ENV", "PYTHON", "UV_", "PIP_REQUIRE"))}
    env.update(PYTHONUSERBASE=str(user_base), **extra)
    return env


def _bin(tmp_path: Path, *tools: str) -> Path:
    """A directory holding only the named tools (so that no uv on this machine is found)."""
    where = tmp_path / "bin"
    where.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found, tool
        (where / tool).symlink_to(found)
    return where


def test_the_quick_start_command_gets_to_uv_on_an_externally_managed_python(
        managed_python: Path, tmp_path: Path) -> None:
    command = quick_start_command()
    assert "remit check" in command
    stub = tmp_path / "stub"  # `remit` as uv finds it here: records that uv ran it
    stub.mkdir()
    (stub / "remit").write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/remit-ran"\n')
    (stub / "remit").chmod(0o755)
    tools = _bin(tmp_path, "sh")
    empty = tmp_path / "elsewhere"  # no project here: uv runs `remit` without a sync
    empty.mkdir()
    path = os.pathsep.join([str(stub), str(managed_python.parent), str(tools)])
    done = subprocess.run(["sh", "-c", command], cwd=empty, capture_output=True, text=True,
                          timeout=300, env=_env(tmp_path / "user", PATH=path,
                                                UV_CACHE_DIR=str(tmp_path / "uv-cache")))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert (tmp_path / "remit-ran").read_text().strip() == "check", output[-3000:]
    assert list((tmp_path / "user").glob("lib/python*/site-packages/uv")), output[-3000:]


def test_scripts_test_installs_uv_the_same_way(managed_python: Path, tmp_path: Path) -> None:
    tools = _bin(tmp_path, "bash", "dirname")
    home = tmp_path / "home"  # no ~/.local/bin/uv of this machine's user
    home.mkdir()
    path = os.pathsep.join([str(managed_python.parent), str(tools)])
    done = subprocess.run(
        [str(tools / "bash"), str(ROOT / "scripts" / "test")], cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
        env=_env(tmp_path / "user", PATH=path, HOME=str(home), PYTHON=str(managed_python),
                 REMIT_TEST_UV_ONLY="1"))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "uv not found; installing it with pip" in done.stderr, output[-3000:]
    used = re.search(r"scripts/test: using uv .* \((\S+)\)$", done.stdout, flags=re.M)
    assert used, output[-3000:]
    assert used.group(1).startswith(str(tmp_path / "user")), used.group(1)
