"""`--exclusive`, the same on `run` and `load`: measure the server, not the machine
(quantload.exclusive)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import typer

from quantload.config import LoadSettings

EXCLUSIVE = typer.Option(
    None,
    "--exclusive/--shared",
    help="Before each server's load (and llama-bench), wait up to load.quiet_wait_s for other"
    " processes to leave the CPUs; with 4 cores or more, pin the servers and the load client to"
    " separate cores.",
)


def quiet_before(settings: LoadSettings, url: str, say: Callable[[str], None]) -> str | None:
    """With load.exclusive, wait for a quiet machine before the load of the server at `url`; the
    line that says how it went (None: no wait asked for)."""
    if not settings.exclusive:
        return None
    from quantload import machine_share
    from quantload.exclusive import wait_for_quiet

    local = urlsplit(url)
    pids: set[int] = set()
    if local.hostname in ("127.0.0.1", "localhost", "::1") and local.port:
        pids = machine_share.listening_pids(local.port)
    waited = wait_for_quiet(settings.interference_cpu_frac, settings.quiet_wait_s, pids, say)
    return waited.sentence("its load", settings.interference_cpu_frac, settings.quiet_wait_s)
