"""A Locust master that acknowledges one worker and then ends without telling it to quit.

What a plan's master does to a worker that joins it while it is quitting: `python
tests/dropping_locust_master.py PORT` listens on 127.0.0.1:PORT, prints "joined" once a worker
has registered, stops its runner without a quit message, holds the socket a further HOLD_S as a
master process still writing its last lines does, and exits. Bounded: it gives up after
WAIT_LIMIT_S without a worker (exit code 1).
"""

from __future__ import annotations

# isort: off
import locust  # noqa: F401  (gevent's monkey-patching first)

# isort: on
import sys
import time

import gevent
from locust.env import Environment

HOLD_S = 2.0
WAIT_LIMIT_S = 120.0


def main(port: int) -> int:
    environment = Environment(user_classes=[])
    runner = environment.create_master_runner("127.0.0.1", port)
    deadline = time.monotonic() + WAIT_LIMIT_S
    while runner.worker_count < 1:
        if time.monotonic() > deadline:
            return 1
        gevent.sleep(0.05)
    print("joined", flush=True)
    gevent.sleep(1.5)  # long enough for the worker to have had an answer to its heartbeat
    runner.greenlet.kill(block=True)  # the runner ends; no quit reaches the worker
    gevent.sleep(HOLD_S)
    runner.server.close(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
