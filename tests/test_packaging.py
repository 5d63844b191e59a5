"""Packaging: the workspace builds four wheels, and remit-core installs on its own.

The build runs once per module (``uv build --all-packages``); the install test uses a
clean virtualenv and the package index for remit-core's dependencies.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DISTS = {
    "remit_core": "remit_core",
    "remit_langgraph": "remit_langgraph",
    "remit_crewai": "remit_crewai",
    "remit_pydantic_graph": "remit_pydantic_graph",
}


def uv_command() -> list[str] | None:
    """How to run uv here: on PATH, the one running us (``uv run`` sets $UV), or ``-m uv``."""
    for candidate in (shutil.which("uv"), os.environ.get("UV")):
        if candidate and _works([candidate]):
            return [candidate]
    if importlib.util.find_spec("uv") is not None and _works([sys.executable, "-m", "uv"]):
        return [sys.executable, "-m", "uv"]
    return None


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run([*cmd, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _dist_name(filename: str) -> str:
    """Normalized distribution name of a wheel or sdist file name."""
    if filename.endswith(".whl"):
        name = filename.split("-")[0]
    else:
        name = filename.removesuffix(".tar.gz").rsplit("-", 1)[0]
    return name.replace("-", "_").replace(".", "_").lower()


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = uv_command()
    if uv is None:
        pytest.skip("uv is not available (not on PATH, no $UV, no `python -m uv`)")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [*uv, "build", "--all-packages", "--out-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"uv build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_build_produces_four_wheels_and_sdists(built: Path) -> None:
    wheels = sorted(p.name for p in built.glob("*.whl"))
    sdists = sorted(p.name for p in built.glob("*.tar.gz"))
    assert len(wheels) == 4, wheels
    assert {_dist_name(w) for w in wheels} == set(DISTS), wheels
    assert len(sdists) == 4, sdists
    assert {_dist_name(s) for s in sdists} == set(DISTS), sdists


@pytest.mark.parametrize("dist", sorted(DISTS))
def test_wheel_ships_py_typed(built: Path, dist: str) -> None:
    (wheel,) = [p for p in built.glob("*.whl") if _dist_name(p.name) == dist]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert f"{DISTS[dist]}/py.typed" in names, names
    assert any(n.startswith(f"{DISTS[dist]}/__init__.py") for n in names), names


def test_core_wheel_installs_into_clean_venv(built: Path, tmp_path: Path) -> None:
    (wheel,) = [p for p in built.glob("*.whl") if _dist_name(p.name) == "remit_core"]
    with zipfile.ZipFile(wheel) as zf:
        assert "remit_core/py.typed" in zf.namelist()

    venv = tmp_path / "venv"
    env = _clean_env()
    proc = subprocess.run(
        [sys.executable, "-m", "venv", str(venv)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, f"venv creation failed:\n{proc.stdout}\n{proc.stderr}"
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")

    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"

    code = (
        "import remit_core; from remit_core import open_store, effect; "
        "s = open_store('sqlite://'); print('ok')"
    )
    proc = subprocess.run(
        [str(python), "-c", code],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, f"import failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip().splitlines()[-1] == "ok", proc.stdout

    # Installed from the wheel, not from the source tree.
    proc = subprocess.run(
        [str(python), "-c", "import remit_core, pathlib; print(pathlib.Path(remit_core.__file__))"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(venv), proc.stdout
