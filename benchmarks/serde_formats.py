"""Why the envelope is msgpack: encode/decode time and size against a JSON envelope.

Both envelopes carry the same type information (datetime, UUID, bytes, tuples,
pydantic models) and round-trip the same values; the JSON one tags typed values
as objects and base64-encodes bytes, as a JSON store must. Run:

    uv run python benchmarks/serde_formats.py
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
import uuid
from typing import Any

from pydantic import BaseModel

from remit_core.serde import Serde


class Message(BaseModel):
    role: str
    content: str
    at: dt.datetime
    id: uuid.UUID


def _json_default(obj: Any) -> Any:
    if isinstance(obj, dt.datetime):
        return {"$dt": obj.isoformat()}
    if isinstance(obj, uuid.UUID):
        return {"$uuid": str(obj)}
    if isinstance(obj, bytes):
        return {"$b64": base64.b64encode(obj).decode()}
    if isinstance(obj, BaseModel):
        return {"$model": f"{type(obj).__module__}:{type(obj).__qualname__}",
                "data": obj.model_dump(mode="python")}
    raise TypeError(type(obj).__name__)


def _json_hook(d: dict[str, Any]) -> Any:
    if "$dt" in d:
        return dt.datetime.fromisoformat(d["$dt"])
    if "$uuid" in d:
        return uuid.UUID(d["$uuid"])
    if "$b64" in d:
        return base64.b64decode(d["$b64"])
    if "$model" in d:
        return Message.model_validate(d["data"])
    return d


def json_encode(value: Any) -> bytes:
    return json.dumps(value, default=_json_default, separators=(",", ":")).encode()


def json_decode(data: bytes) -> Any:
    return json.loads(data, object_hook=_json_hook)


SHAPES: dict[str, Any] = {
    "small state": {"count": 3, "name": "order-42", "done": False, "total": 12.5},
    "chat, 50 messages": {"messages": [
        Message(role="user" if i % 2 else "assistant", content="lorem ipsum " * 20,
                at=dt.datetime(2026, 1, 1, 12, i % 60), id=uuid.UUID(int=i))
        for i in range(50)]},
    "1 MB bytes": {"blob": bytes(range(256)) * 4096},
    "nested 1k records": {"rows": [{"id": i, "tags": ["a", "b"], "score": i / 7,
                                    "when": dt.datetime(2026, 1, 1)} for i in range(1000)]},
}


def bench(fn: Any, arg: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn(arg)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    serde = Serde()
    print(f"{'shape':<20} {'format':<8} {'encode us':>10} {'decode us':>10} {'bytes':>10}")
    for name, value in SHAPES.items():
        n = 20 if "MB" in name or "1k" in name else 500
        m = serde.encode(value)
        j = json_encode(value)
        assert serde.decode(m) == value and json_decode(j) == value
        for fmt, enc, dec, data in (("msgpack", serde.encode, serde.decode, m),
                                    ("json", json_encode, json_decode, j)):
            print(f"{name:<20} {fmt:<8} {bench(enc, value, n):>10.1f} "
                  f"{bench(dec, data, n):>10.1f} {len(data):>10}")


if __name__ == "__main__":
    main()
