"""Every connection pool a load unit test makes is closed when the test ends: its idle
connections and the socket pair that keeps kernel receive stamps on would otherwise be left to
the garbage collector, and an unclosed socket is a failing warning here (warnings are errors)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from quantload.load.client import ConnectionPool


@pytest.fixture(autouse=True)
def pools_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    made: list[ConnectionPool] = []
    make = ConnectionPool.__init__

    def made_here(pool: ConnectionPool, *args: Any, **kwargs: Any) -> None:
        make(pool, *args, **kwargs)
        made.append(pool)

    monkeypatch.setattr(ConnectionPool, "__init__", made_here)
    yield
    for pool in made:
        pool.close()
