"""Packaging: the workspace builds five wheels, the runtime wheels carry no check harness,
and remit-core installs on its own (where ``remit check`` says what to install).

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
    "remit_check": "remit_check",
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


#: the runtime distributions: what ``pip install remit-<adapter>`` brings
RUNTIME = sorted(set(DISTS) - {"remit_check"})


def test_build_produces_five_wheels_and_sdists(built: Path) -> None:
    wheels = sorted(p.name for p in built.glob("*.whl"))
    sdists = sorted(p.name for p in built.glob("*.tar.gz"))
    assert len(wheels) == 5, wheels
    assert {_dist_name(w) for w in wheels} == set(DISTS), wheels
    assert len(sdists) == 5, sdists
    assert {_dist_name(s) for s in sdists} == set(DISTS), sdists


def _wheel(built: Path, dist: str) -> zipfile.ZipFile:
    (wheel,) = [p for p in built.glob("*.whl") if _dist_name(p.name) == dist]
    return zipfile.ZipFile(wheel)


def _entry_points(zf: zipfile.ZipFile) -> str:
    names = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return zf.read(names[0]).decode() if names else ""


@pytest.mark.parametrize("dist", RUNTIME)
def test_runtime_wheels_hold_no_check_harness(built: Path, dist: str) -> None:
    """``pip install remit-langgraph`` (or another runtime package) installs no scenario,
    harness, report or pytest plugin: they are the remit-check wheel's."""
    with _wheel(built, dist) as zf:
        names = zf.namelist()
        entry_points = _entry_points(zf)
    harness = [n for n in names if set(n.split("/")[1:]) & {
        "check", "check.py", "pytest_plugin.py", "harness.py", "report.py", "matrix.py"}]
    assert harness == [], harness
    assert not any(n.startswith("remit_check/") for n in names), names
    assert "pytest11" not in entry_points, entry_points
    with _wheel(built, "remit_check") as zf:
        checks = set(zf.namelist())
    assert {"remit_check/__init__.py", "remit_check/harness.py", "remit_check/report.py",
            "remit_check/pytest_plugin.py", "remit_check/langgraph/matrix.py",
            "remit_check/crewai/matrix.py",
            "remit_check/pydantic_graph/matrix.py"} <= checks


def test_adapters_register_their_parts(built: Path) -> None:
    """Each adapter wheel declares its migrate command, its checks, its fixtures and its
    recovery targets (remit worker) in the group remit.adapters; remit-core declares
    none, and remit-check the pytest plugin."""
    for dist, name in (("remit_langgraph", "langgraph"), ("remit_crewai", "crewai"),
                       ("remit_pydantic_graph", "pydantic-graph")):
        with _wheel(built, dist) as zf:
            declared = _entry_points(zf)
        assert "[remit.adapters]" in declared, declared
        for part in ("migrate", "check", "pytest", "recover"):
            assert f"{name}.{part} = " in declared, declared
    with _wheel(built, "remit_core") as zf:
        assert _entry_points(zf).strip() == "[console_scripts]\nremit = remit_core.cli:main"
    with _wheel(built, "remit_check") as zf:
        assert "remit = remit_check.pytest_plugin" in _entry_points(zf)


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

    # without remit-check, `remit check` says what to install: one line, exit status 2
    proc = subprocess.run(
        [str(bindir / "remit"), "check", "--reps", "1"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "", proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "remit check: the fault matrix is not installed (it is the package remit-check): "
        "pip install remit-check"], proc.stderr
