"""How an HTTP client's error is said to a user: on one line, without the client's own advice.

httpx's status errors end with a line pointing at a web page about HTTP status codes, and its
transport errors may span lines; `said` keeps what a user can act on: the status and its reason,
or the transport error's kind and first line.
"""

from __future__ import annotations

import httpx

MAX_CHARS = 200


def said(error: Exception) -> str:
    """`error` as one short line (see the module docstring)."""
    if isinstance(error, httpx.HTTPStatusError):
        answer = error.response
        return f"HTTP {answer.status_code} {answer.reason_phrase}".rstrip()
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    kind = type(error).__name__
    return f"{kind}: {first[:MAX_CHARS]}" if first else kind
