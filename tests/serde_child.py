"""Decode stored bytes in a child process, so that a crash of the decoder is seen, not suffered.

    python -m tests.serde_child [--lenient]

The child imports remit's envelope with LangGraph's registrations (and the packages of
langchain-core whose lazy attributes once made a decode import modules), then reads
frames from stdin -- a 4-byte big-endian length, then the blob -- and answers each with
one JSON line on stdout::

    {"outcome": "ok" | "corrupt" | "other", "type": ..., "message": ...,
     "imported": [modules that appeared in sys.modules during the decode]}

:class:`Decoder` is the parent side: a long-lived child, restarted when it dies; a
death is reported as the outcome ``"died"`` with the signal or exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]


def _child(lenient: bool) -> None:
    import importlib

    # packages with lazy attributes: a getattr on them would import a module
    for name in ("langchain_core.embeddings", "langchain_core.language_models"):
        importlib.import_module(name)

    import remit_langgraph._serde  # noqa: F401  (LangGraph's registrations on default_serde)
    from remit_core.errors import CorruptRecord
    from remit_core.serde import Serde, default_serde

    serde = default_serde
    if lenient:
        from remit_core.serde import load_registrations

        serde = Serde(lenient=True)
        load_registrations(serde)
    stdin, stdout = sys.stdin.buffer, sys.stdout
    print(json.dumps({"ready": True}), file=stdout, flush=True)
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        (size,) = struct.unpack(">I", head)
        blob = stdin.read(size)
        before = set(sys.modules)
        answer: dict[str, Any]
        try:
            value = serde.decode(blob, record="fuzzed")
        except CorruptRecord as exc:
            answer = {"outcome": "corrupt", "type": type(exc).__name__, "message": str(exc)}
        except BaseException as exc:  # reported to the parent
            answer = {"outcome": "other", "type": type(exc).__name__, "message": str(exc)[:500]}
        else:
            try:
                shown = repr(value)[:500]
            except BaseException as exc:
                shown = f"<repr failed: {type(exc).__name__}>"
            answer = {"outcome": "ok", "type": type(value).__name__, "message": shown}
        answer["imported"] = sorted(set(sys.modules) - before)
        print(json.dumps(answer), file=stdout, flush=True)


class Decoder:
    """The parent side: decode blobs in a long-lived child; restart it after a death."""

    def __init__(self, *, lenient: bool = False) -> None:
        self.lenient = lenient
        self.proc: subprocess.Popen[bytes] | None = None
        self.err: IO[bytes] | None = None
        self.starts = 0

    def _start(self) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "tests.serde_child"] + (["--lenient"] if self.lenient else [])
        env = dict(os.environ, PYTHONFAULTHANDLER="1")
        # a file, not a pipe: a chatty child never blocks
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 -- closed in _stderr()
        proc = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self.err, env=env)
        self.starts += 1
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise RuntimeError(f"the decoding child did not start: {self._stderr()}")
        return proc

    def _stderr(self) -> str:
        if self.err is None:
            return ""
        self.err.seek(0)
        text = self.err.read().decode(errors="replace")[-2000:]
        self.err.close()
        self.err = None
        return text

    def decode(self, blob: bytes) -> dict[str, Any]:
        if self.proc is None:
            self.proc = self._start()
        proc = self.proc
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(struct.pack(">I", len(blob)) + blob)
            stdin.flush()
            line = stdout.readline()
        except BrokenPipeError:
            line = b""
        if line:
            answer: dict[str, Any] = json.loads(line)
            return answer
        code = proc.wait()
        self.proc = None
        with contextlib.suppress(BrokenPipeError):
            stdin.close()
        stdout.close()
        err = self._stderr()
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        return {"outcome": "died", "type": how, "message": err, "imported": []}

    def decode_all(self, blobs: Iterable[bytes]) -> list[dict[str, Any]]:
        return [self.decode(b) for b in blobs]

    def close(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
            self._stderr()

    def __enter__(self) -> Decoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    _child(lenient="--lenient" in sys.argv[1:])
