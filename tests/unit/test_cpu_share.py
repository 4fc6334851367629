"""Other processes' CPU share: the busy threshold.

With real processes: tests/integration/test_cpu_share_processes.py.
"""

from __future__ import annotations

from quantload import cpu_share


def test_busy_threshold() -> None:
    assert not cpu_share.busy(None)
    assert not cpu_share.busy(0.1)
    assert cpu_share.busy(0.5)
