"""Store URLs: parsing, and masking secrets before a URL appears in a message."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit, urlunsplit


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{user}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def split_options(query: str, known: frozenset[str] | set[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Split a query string into remit's own options and the rest (for the driver)."""
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k in known:
            ours[k] = v
        else:
            rest.append((k, v))
    return ours, rest
