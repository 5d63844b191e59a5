"""A URL's password never appears in a message, attribute, repr, log line or CLI output,
whatever characters it holds (issue 13, item 4; DESIGN.md section 4b).

The passwords below hold unencoded ``#``, ``/``, ``?`` and ``@``, which URL parsers read
as the start of a fragment, path or query, or as the end of the userinfo. Each password
is made of distinctive 4-character pieces; no piece may appear anywhere.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from remit_core import open_store
from remit_core.urls import mask_url

PASSWORDS = [
    "Zq7x#Xv9y-Kp2z",
    "Zq7x/Xv9y-Kp2z",
    "Zq7x?Xv9y=Kp2z",
    "Zq7x@Xv9y-Kp2z",
    "Zq7x#Xv9y/Kp2z?Wm4w@Rt6u",
    "Zq7x@Xv9y/Kp2z",
    "Zq7x:Xv9y@@Kp2z#",
]
PIECES = ("Zq7x", "Xv9y", "Kp2z", "Wm4w", "Rt6u")


def leaks(text: str) -> list[str]:
    return [p for p in PIECES if p in text]


def urls(pw: str, redis_port: int | None = None, pg_ok: bool = False) -> list[str]:
    """Unreachable servers, reachable ones and malformed URLs, for every scheme."""
    out = [
        f"postgresql://u:{pw}@127.0.0.1:1/test?connect_timeout=2",
        f"postgres://u:{pw}@127.0.0.1:1/test",
        f"redis://:{pw}@127.0.0.1:1/0",
        f"redis://user:{pw}@127.0.0.1:1/0?prefix=p",
        f"rediss://:{pw}@127.0.0.1:1/0",
        # malformed: a port that is not a number, a broken IPv6 host, no host at all
        f"postgresql://u:{pw}@127.0.0.1:notaport/test",
        f"redis://:{pw}@[::1/0",
        f"postgresql://u:{pw}@",
        f"redis://:{pw}@127.0.0.1:1/0?password={pw}",
        f"postgresql://127.0.0.1:1/test?user=u&password={pw}&connect_timeout=2",
    ]
    if pg_ok:
        out.append(f"postgresql://postgres:{pw}@127.0.0.1:5432/test?schema=remit_t_secret")
    if redis_port is not None:
        out.append(f"redis://:{pw}@127.0.0.1:{redis_port}/0?prefix=remit-t-secret")
        out.append(f"redis://default:{pw}@127.0.0.1:{redis_port}/0?prefix=remit-t-secret")
    return out


def exception_texts(exc: BaseException) -> list[str]:
    texts = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    texts += [str(v) for v in vars(exc).values()]
    texts += [repr(a) for a in exc.args]
    return texts


@pytest.mark.parametrize("pw", PASSWORDS)
def test_mask_url_masks_every_piece(pw: str) -> None:
    for url in urls(pw, 6379, True):
        masked = mask_url(url)
        assert leaks(masked) == [], (url, masked)
        assert "***" in masked, (url, masked)


def test_mask_url_keeps_what_is_not_secret() -> None:
    assert mask_url("postgresql://bob:hunter2@db:5432/x?schema=s") == \
        "postgresql://bob:***@db:5432/x?schema=s"
    assert mask_url("postgresql://u:9#Ab-secret@host/db") == "postgresql://u:***@host/db"
    assert mask_url("redis://:p@ss/w0rd@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_url("postgresql://bob@db/x") == "postgresql://bob@db/x"
    assert mask_url("sqlite:////var/lib/app.db") == "sqlite:////var/lib/app.db"
    assert mask_url("postgresql://h/db?user=u&password=s#e&c&sslmode=off") == \
        "postgresql://h/db?user=u&password=***&sslmode=off"
    # an "@" after the host may end a password: when in doubt, more is masked
    assert mask_url("postgresql://h/db?user=u&password=s#e@c&sslmode=off") == \
        "postgresql://***&sslmode=off"


def _redis_port(request: pytest.FixtureRequest) -> int | None:
    try:
        server = request.getfixturevalue("redis_server")
    except pytest.skip.Exception:
        return None
    return int(re.search(r":(\d+)/", server).group(1))  # type: ignore[union-attr]


def _pg_ok(request: pytest.FixtureRequest) -> bool:
    try:
        request.getfixturevalue("pg_base_url")
    except pytest.skip.Exception:
        return False
    return True


@pytest.fixture
def drop_secret_schema(request: pytest.FixtureRequest) -> Any:
    yield
    if _pg_ok(request):
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_base_url"), autocommit=True) as c:
            c.execute('DROP SCHEMA IF EXISTS "remit_t_secret" CASCADE')


@pytest.mark.parametrize("pw", PASSWORDS)
def test_open_store_never_shows_the_password(pw: str, request: pytest.FixtureRequest,
                                             caplog: pytest.LogCaptureFixture,
                                             drop_secret_schema: None) -> None:
    port, pg_ok = _redis_port(request), _pg_ok(request)
    caplog.set_level(logging.DEBUG)
    for url in urls(pw, port, pg_ok):
        try:
            store = open_store(url)
        except Exception as exc:
            for text in exception_texts(exc):
                assert leaks(text) == [], (url, type(exc).__name__, text)
        else:
            try:
                for text in (store.url, repr(store), str(vars(store).get("url"))):
                    assert leaks(text) == [], (url, text)
            finally:
                store.close()
    for record in caplog.records:
        text = record.getMessage() + (
            "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else "")
        assert leaks(text) == [], text


def _remit() -> str:
    return str(Path(sys.executable).with_name("remit"))


def _run_all(commands: list[list[str]], timeout: float = 120) -> list[tuple[list[str], str]]:
    """Run the commands two at a time (the machine has two cores); stdout+stderr of each."""
    out: list[tuple[list[str], str]] = []
    for i in range(0, len(commands), 2):
        procs = [(c, subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)) for c in commands[i:i + 2]]
        for c, p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((c, text))
    return out


def test_remit_inspect_never_shows_the_password(request: pytest.FixtureRequest,
                                                drop_secret_schema: None) -> None:
    port, pg_ok = _redis_port(request), _pg_ok(request)
    commands = []
    # (each command is a new interpreter, ~4 s here: one password with '#' alone and one
    # with all four of '#', '/', '?', '@'; test_open_store_never_shows_the_password walks
    # every password through the same code in-process)
    for pw in ("Zq7x#Xv9y-Kp2z", "Zq7x#Xv9y/Kp2z?Wm4w@Rt6u"):
        for url in urls(pw, port, pg_ok):
            if url.startswith(("postgres://", "rediss://")) or "user=" in url:
                continue  # the same code paths as their neighbours; keeps the test short
            commands.append([_remit(), "inspect", url])
            if "127.0.0.1:1/" not in url and "@127.0.0.1:" in url:  # a server that answers
                commands.append([_remit(), "inspect", url, "some-run", "--json"])
    for command, text in _run_all(commands):
        assert leaks(text) == [], (command[2], text)
        assert "Traceback" not in text, (command[2], text)


def test_remit_check_store_never_shows_the_password(request: pytest.FixtureRequest) -> None:
    port = _redis_port(request)
    pw = "Zq7x#Xv9y/Kp2z?Wm4w@Rt6u"
    stores = [f"postgresql://u:{pw}@127.0.0.1:1/test?connect_timeout=2",
              f"redis://:{pw}@127.0.0.1:1/0"]
    if port is not None:
        stores.append(f"redis://:{pw}@127.0.0.1:{port}/0?prefix=remit-t-secret")
    commands = [[_remit(), "check", "--store", s, "--framework", "crewai", "--fault",
                 "second-resume", "--reps", "1", "--k", "2"] for s in stores]
    for command, text in _run_all(commands, timeout=300):
        assert leaks(text) == [], (command[3], text)
