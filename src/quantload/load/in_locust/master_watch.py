"""A worker notices that the master it joined has gone silent, and ends so that a new one can join.

A Locust master answers each of its workers' heartbeats (one a second) while it runs. A worker
started just as a plan's master was quitting can be acknowledged by that master and never told to
quit; the socket then reconnects to the next master on the same address, which ignores the
heartbeats of a worker it never registered, and Locust's worker waits for a sign of its master for
60 s (or for ever, when it never had one). The next master meanwhile waits for its workers and
gives up after `load.workers_timeout_s` (also 60 s by default).

`MasterWatch` ends the worker (`runner.quit()`) once its master has answered nothing for
`silent_limit_s`, so `quantload load-worker` starts a fresh worker at once; the process then
exits with `MASTER_LOST_EXIT` (quantload.load.processes), which the worker loop counts as neither
a plan served nor a failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent

from quantload.load.processes import MASTER_SILENT_LIMIT_S

CHECK_EVERY_S = 1.0

_log = logging.getLogger(__name__)


class MasterWatch:
    """Ends a connected worker whose master has not answered for `silent_limit_s`."""

    def __init__(
        self,
        runner: Any,
        silent_limit_s: float = MASTER_SILENT_LIMIT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runner = runner  # a locust WorkerRunner: last_heartbeat_timestamp, quit()
        self.silent_limit_s = silent_limit_s
        self.clock = clock
        self.watch_started = clock()  # the runner is connected once it exists
        self.lost = False

    def silent_s(self) -> float:
        """Seconds since the master last answered (since the watch began, if it never has)."""
        heard = self.runner.last_heartbeat_timestamp
        last = max(heard, self.watch_started) if heard is not None else self.watch_started
        return self.clock() - last

    def check(self) -> bool:
        """True (and the runner quit) once the master has been silent too long."""
        if self.lost:
            return True
        silent_s = self.silent_s()
        if silent_s <= self.silent_limit_s:
            return False
        self.lost = True
        _log.warning(
            "the master has not answered for %.1f s (over %.0f s): it ended without this worker;"
            " ending so that a new worker joins the next master",
            silent_s,
            self.silent_limit_s,
        )
        self.runner.quit()
        return True

    def run(self) -> None:
        """Check once a second until the master is lost (or the greenlet is killed)."""
        while not self.check():
            gevent.sleep(CHECK_EVERY_S)
