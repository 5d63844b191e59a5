"""Store URLs: parsing, and masking secrets before a URL appears in a message."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_SECRET_PARAMS = {"password", "sslpassword", "pass", "pwd", "secret", "token"}


def mask_url(url: str) -> str:
    """The URL with any password (in the netloc or a ``password=`` parameter) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
            query = urlencode([(k, "***" if k.lower() in _SECRET_PARAMS else v)
                               for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


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
