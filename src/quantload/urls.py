"""The one check of a server's base URL: every part of quantload that talks to a server uses it.

`http_address` splits `http://host:port/prefix` into its parts, or raises `BadUrl` naming what
is wrong (scheme, no host, a port that is not a number from 1 to 65535, a broken IPv6 literal).
Callers turn `BadUrl` into their own error (a ConfigError at start-up), so a bad URL is refused
in one line before any process starts, never inside a load process or a scrape.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
EXAMPLE = "http://127.0.0.1:8080"


class BadUrl(ValueError):
    """A URL quantload cannot talk to; the message says which part is wrong."""


def header_safe(value: str) -> bool:
    """Whether `value` can be sent as an HTTP header value as it is: printable Latin-1, no line
    break or other control character (which would end the header, or start a forged one)."""
    return all(" " <= char <= "~" or "\xa0" <= char <= "\xff" for char in value)


@dataclass(frozen=True)
class HttpAddress:
    """Where a server is: scheme, host (IPv6 without brackets), port and the path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @property
    def default_port(self) -> bool:
        return self.port == (443 if self.scheme == "https" else 80)


def http_address(url: str) -> HttpAddress:
    """The parts of an http(s) base URL; BadUrl when any of them is unusable."""
    try:
        parts = urlsplit(url.strip())
    except ValueError as error:  # e.g. "Invalid IPv6 URL"
        raise BadUrl(f"{url!r} is not a URL ({error})") from None
    if parts.scheme not in SCHEMES:
        shown = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise BadUrl(f"{url!r} is not an http(s) URL ({shown})")
    if not parts.hostname:
        raise BadUrl(f"{url!r} has no host")
    try:
        port = parts.port
    except ValueError:
        port_text = parts.netloc.rpartition(":")[2]
        raise BadUrl(f"{url!r} has a bad port {port_text!r} (a number from 1 to 65535)") from None
    if port == 0:
        raise BadUrl(f"{url!r} has port 0 (a number from 1 to 65535)")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return HttpAddress(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))
