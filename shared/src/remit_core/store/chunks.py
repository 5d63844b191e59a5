"""Large values are stored once per run, in content-defined chunks.

A state value that stays the same while the run goes on (a document, an image, a
long list of messages that only grows) is handed to the store again and again:
as a new channel version, as the graph input, as a task's pending write. Stored
whole, each copy costs its full size. A value of at least
:attr:`Store.chunk_threshold <remit_core.store.Store.chunk_threshold>` bytes
(encoded) is therefore cut with FastCDC (``pyfastcdc``) into chunks of about
:attr:`~remit_core.store.Store.chunk_size` bytes whose boundaries depend on the
content, not on the offset. Each chunk is stored once per run under its SHA-256
digest, and the value's row holds a *manifest*: the digests in order. Two values
that share a long run of bytes (the same 1 MB inside two different envelopes, a
message list with one message more) share all the chunks inside that run; only
the chunks at its edges differ.

A manifest starts with ``0x00``, which no envelope does (an envelope starts with
its format version, 1 or more), so a stored value is read as a manifest only
when it is one. Chunks belong to a run: deleting or pruning the run deletes the
chunks no remaining value refers to, and copying a run copies its chunks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from pyfastcdc import FastCDC

from remit_core.errors import CorruptRecord

MAGIC = b"\x00\x01"
"""A manifest: this, then 32-byte SHA-256 digests."""
DIGEST_SIZE = 32


HEAD = 64
"""The first bytes of a value are a chunk of their own: they hold the envelope's and the
outer container's headers (a list's length), which change whenever the value grows, so
the content-defined chunk after them stays the same (else the first chunk, up to four
times ``size``, would be stored again for every new version of a growing list)."""


def split(value: bytes, *, size: int, into: dict[bytes, bytes]) -> bytes:
    """The manifest of ``value``; its chunks are added to ``into`` (digest -> bytes)."""
    digests = []
    head, rest = value[:HEAD], memoryview(value)[HEAD:]
    # a FastCDC object is not safe to share between threads; making one is cheap
    pieces = [head, *(bytes(cut.data) for cut in FastCDC(size).cut_buf(rest))] if rest else [head]
    for piece in pieces:
        digest = hashlib.sha256(piece).digest()
        into.setdefault(digest, piece)
        digests.append(digest)
    return MAGIC + b"".join(digests)


def is_manifest(value: bytes) -> bool:
    return value[:2] == MAGIC


def digests(manifest: bytes) -> list[bytes]:
    """The chunk digests a manifest names, in order."""
    body = manifest[len(MAGIC):]
    return [body[i:i + DIGEST_SIZE] for i in range(0, len(body), DIGEST_SIZE)]


def referenced(values: Iterable[bytes]) -> set[bytes]:
    """Every digest named by the manifests among ``values``."""
    out: set[bytes] = set()
    for value in values:
        if is_manifest(value):
            out.update(digests(value))
    return out


def join(manifest: bytes, chunks: Mapping[bytes, bytes], *, record: str) -> bytes:
    """The value a manifest stands for; a missing chunk is a :class:`CorruptRecord`."""
    try:
        return b"".join(chunks[d] for d in digests(manifest))
    except KeyError as exc:
        raise CorruptRecord(
            f"{record}: chunk {exc.args[0].hex()} of this value is missing from the store; "
            "the value cannot be read (was the run pruned or deleted while it was read?)",
            record=record,
        ) from None
