"""One log line per kind of trouble per interval, never a traceback per scrape."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """Logs a message for a key at most once every `interval_s`, saying how many it held back."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, level: int, key: str, message: str) -> bool:
        """Log `message` unless `key` was logged less than `interval_s` ago; True when logged."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        held = self._held.pop(key, 0)
        suffix = (
            f" ({held} more like this in the last {now - last:.0f} s)" if held and last is not None else ""
        )
        self._logger.log(level, "%s%s", message, suffix)
        self._last[key] = now
        return True

    def forget(self, prefix: str) -> None:
        """Drop the history of every key starting with `prefix` (e.g. a target that recovered)."""
        for key in [k for k in self._last if k.startswith(prefix)]:
            self._last.pop(key, None)
            self._held.pop(key, None)
