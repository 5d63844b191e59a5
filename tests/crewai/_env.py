"""Keep CrewAI's side files (home dir, caches, locks, storage) inside one temporary
directory, with telemetry and tracing off. Imported before crewai, in the test
process and in every worker process (they inherit the environment)."""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile

HOME_VAR = "REMIT_CREWAI_TEST_HOME"


#: the process that made the directory (it removes it when the test session ends)
OWNER: int | None = None


def _remove(home: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(home, ignore_errors=True)


def isolate() -> str:
    global OWNER
    home = os.environ.get(HOME_VAR)
    if not home:
        home = tempfile.mkdtemp(prefix="remit-crewai-")
        os.environ[HOME_VAR] = home
        OWNER = os.getpid()
        # removed at exit after multiprocessing has removed its own temporary directory
        # (pymp-*, inside TMPDIR, so inside this one): its finalizer has exit priority
        # -100 and a lower one runs after it. (An atexit hook ran first whenever
        # multiprocessing was imported before this module, and multiprocessing's then
        # printed a FileNotFoundError traceback at the end of the session.)
        multiprocessing.util.Finalize(None, _remove, args=(home, OWNER), exitpriority=-200)
    for sub in ("home", "data", "cache", "config", "tmp", "storage"):
        os.makedirs(os.path.join(home, sub), exist_ok=True)
    # TMPDIR moves here for the whole test session: other users must still reach the
    # temporary files tests make for them (the private PostgreSQL runs as "postgres")
    os.chmod(home, 0o755)
    os.chmod(os.path.join(home, "tmp"), 0o1777)
    os.environ.update({
        "HOME": os.path.join(home, "home"),
        "XDG_DATA_HOME": os.path.join(home, "data"),
        "XDG_CACHE_HOME": os.path.join(home, "cache"),
        "XDG_CONFIG_HOME": os.path.join(home, "config"),
        "TMPDIR": os.path.join(home, "tmp"),
        "CREWAI_STORAGE_DIR": os.path.join(home, "storage"),
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_DISABLE_TRACKING": "true",
        "CREWAI_TRACING_ENABLED": "false",
        "OTEL_SDK_DISABLED": "true",
    })
    tempfile.tempdir = None  # re-read TMPDIR
    return home


isolate()
