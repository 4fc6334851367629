"""The one check of every address a user gives: a server's base URL, a `HOST:PORT` to scrape, a
host to listen on or to reach. Every part of quantload that reads one uses these.

`http_address` splits `http://host:port/prefix` into its parts, or raises `BadUrl` naming what
is wrong (scheme, no host, a port that is not a number from 1 to 65535, a broken IPv6 literal).
`host_port` reads `HOST:PORT` (or a URL with a port) and writes it back as its consumer takes it
(`HostPort.address`: an IPv6 host in brackets, as Prometheus' targets and listen flags need).
`host_problem` checks a host name or IP literal by its form alone; `listen_problem` also tries
to listen on it. Callers turn `BadUrl` into their own error (a ConfigError at start-up), so a bad
address is refused in one line before any process starts, never inside a load process or a scrape.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
EXAMPLE = "http://127.0.0.1:8080"
UNSPECIFIED = ("0.0.0.0", "::")  # listen on every address; nothing can be reached there
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # compose names hold "_"
MAX_HOST_CHARS = 253


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


def host_problem(host: str) -> str | None:
    """What is wrong with `host` as a host name or IP address (None: nothing); by its form alone."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        return None
    if not bare:
        return "an empty host"
    labels = bare.rstrip(".").split(".")
    if len(bare) > MAX_HOST_CHARS or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return f"{host!r} is not a host name or IP address"
    return None


def listen_problem(host: str) -> str | None:
    """What keeps a server from listening on `host` here (None: it can): its form, then a bind."""
    problem = host_problem(host)
    if problem is not None:
        return problem
    bare = host[1:-1] if host.startswith("[") else host
    try:
        infos = socket.getaddrinfo(bare, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, _, _, address = infos[0]
        with socket.socket(family, kind) as probe:
            probe.bind(address)
    except OSError as error:
        return f"{host!r} is not an address of this machine ({error.strerror or error})"
    return None


@dataclass(frozen=True)
class HostPort:
    """A host and a port, as a scrape target or a listen address."""

    host: str  # an IPv6 literal without brackets
    port: int

    @property
    def address(self) -> str:
        """`host:port`, an IPv6 host in brackets (`[::1]:9090`), as Prometheus takes it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def unspecified(self) -> bool:
        return self.host in UNSPECIFIED


def host_port(text: str) -> HostPort:
    """`HOST:PORT`, `[IPv6]:PORT` or a URL with a port, checked; BadUrl naming what is wrong."""
    given = text.strip()
    url = given if "://" in given else f"http://{given}"
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise BadUrl(f"{text!r} is not HOST:PORT ({error})") from None
    host = parts.hostname
    if not host:
        raise BadUrl(f"{text!r} has no host (give HOST:PORT, e.g. 10.0.0.5:9646)")
    try:
        port = parts.port
    except ValueError:
        port_text = parts.netloc.rpartition(":")[2]
        raise BadUrl(f"{text!r} has a bad port {port_text!r} (a number from 1 to 65535)") from None
    if port is None or port == 0:
        raise BadUrl(f"{text!r} has no port (give HOST:PORT with a port from 1 to 65535)")
    problem = host_problem(host)
    if problem is not None:
        raise BadUrl(f"{text!r}: {problem}")
    return HostPort(host, port)


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
