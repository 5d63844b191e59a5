"""Store URLs: masking secrets before a URL or a driver's message appears anywhere.

Masking works on the raw string, never on what a URL parser makes of it: a password
may hold an unencoded ``#``, ``/``, ``?`` or ``@``, which parsers read as the start of a
fragment, path or query, or as the end of the userinfo, and then hand back only a piece
of the password (or none) while the rest travels on as "host" or "path". So:

* the userinfo is everything between ``scheme://`` and the **last** ``@`` of the URL:
  a password may hold ``@``, a host never does. Everything after the first ``:`` of
  the userinfo is the password. (An ``@`` in a query value makes more than the password
  masked; when in doubt, remit masks more.)
* a ``password=``-like query parameter is masked up to the next ``&name=`` or the end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote, urlsplit

_SECRET_PARAMS = ("password", "sslpassword", "pass", "pwd", "secret", "token")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# a secret query (or key=value) parameter: its value runs to the next "&name=" or the end
_PARAM_SECRET = re.compile(
    r"(?:(?<=[?&;\s])|^)(?:" + "|".join(_SECRET_PARAMS) + r")\s*=\s*"
    r"(.*?)(?=&[A-Za-z_][A-Za-z0-9_.-]*=|\s+[A-Za-z_][A-Za-z0-9_]*\s*=|$)",
    re.IGNORECASE | re.DOTALL)
_DELIMS = re.compile(r"[#/?@&=:;\s]+")
#: a secret shorter than this is not searched for in driver messages (it would mask
#: ports and ordinary words); the URL itself is always masked in full
MIN_SECRET = 4


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """The (start, end) spans of ``url`` that hold a secret, found on the raw string."""
    spans: list[tuple[int, int]] = []
    m = _SCHEME.match(url)
    start = m.end() if m else 0
    at = url.rfind("@", start)
    if at >= 0:
        userinfo = url[start:at]
        colon = userinfo.find(":")
        if colon >= 0:
            spans.append((start + colon + 1, at))
        elif re.search(r"[/?#\s]", userinfo):
            spans.append((start, at))  # not a plain user name: mask all of it
    for p in _PARAM_SECRET.finditer(url):
        spans.append(p.span(1))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def mask_url(url: str) -> str:
    """``url`` with every password (in the userinfo or a ``password=`` parameter) as ``***``."""
    url = str(url)
    out, last = [], 0
    for a, b in _secret_spans(url):
        out.append(url[last:a])
        out.append("***")
        last = b
    out.append(url[last:])
    return "".join(out)


def url_secrets(url: str) -> list[str]:
    """Every string of ``url`` that must not appear in a message, longest first: the raw
    passwords, their decoded forms, what a URL parser takes for the password, and the
    pieces of each between delimiters (a parser may hand a piece on as a host or path)."""
    url = str(url)
    found: set[str] = set()
    for a, b in _secret_spans(url):
        found.add(url[a:b])
    try:
        parsed = urlsplit(url).password
    except ValueError:
        parsed = None
    if parsed:
        found.add(parsed)
    for s in list(found):
        found.add(unquote(s))
        found.update(_DELIMS.split(s))
        found.update(_DELIMS.split(unquote(s)))
    return sorted((s for s in found if len(s) >= MIN_SECRET), key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` (a driver's message) with every secret replaced by ``***``, URLs and
    ``password=`` parameters in it masked, on one line."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET}, key=len,
                         reverse=True):
        text = text.replace(secret, "***")
    text = re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", lambda m: mask_url(m.group(0)), text)
    text = _PARAM_SECRET.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + "***", text)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def scrub_lines(text: str, secrets: Iterable[str | None] = ()) -> str:
    """:func:`scrub` for each line of ``text`` (a traceback), keeping the lines."""
    found = list(secrets)
    return "\n".join(line[:len(line) - len(line.lstrip())] + scrub(line, found)
                     for line in text.rstrip("\n").splitlines())


def leaks(text: str, secrets: Sequence[str]) -> bool:
    """Whether ``text`` holds any of ``secrets``."""
    return any(s in text for s in secrets)


def password_hint(url: str) -> str:
    """A hint for an error about ``url`` when its password holds a character that URL
    parsers take for a delimiter (then the driver saw another host, port or path).
    Python's parser (redis-py's) ends the userinfo at the last ``@``, libpq's at the
    first, so ``@`` counts for PostgreSQL URLs only."""
    m = _SCHEME.match(url)
    start = m.end() if m else 0
    at = url.rfind("@", start)
    if at < 0:
        return ""
    userinfo = url[start:at]
    colon = userinfo.find(":")
    delimiters = r"[#/?@]" if url[:start].lower().startswith("postgres") else r"[#/?]"
    if colon >= 0 and re.search(delimiters, userinfo[colon + 1:]):
        return (" If the password holds '#', '/', '?' or '@', percent-encode it in the URL "
                "(urllib.parse.quote(password, safe='')).")
    return ""


__all__ = ["leaks", "mask_url", "password_hint", "scrub", "scrub_lines", "url_secrets"]


def with_options(url: str, **options: object) -> str:
    """``url`` with ``name=value`` query options appended (``?`` or ``&`` as needed).

    Works on the raw string, like the masking above, so a password holding ``?`` is
    not mistaken for the start of the query (the options then follow it as well, and
    the store refuses the URL with a message, rather than losing the password)."""
    if not options:
        return url
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"
