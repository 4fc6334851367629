"""Watching the RPC hosts a llama-server is split over, so a lost host ends it instead of a hang.

llama.cpp's RPC client has no timeouts: when an rpc-server dies the llama-server aborts at its next
call ("Remote RPC server crashed"), but when the host is cut off (a partition, a pulled cable) the
llama-server waits on its socket for as long as the kernel keeps the connection, and every request
hangs with it. `RpcWatch` asks each host's status endpoint (`quantload rpc-server`,
quantload.llamacpp.rpc_server) every `poll_s`; a host whose rpc-server has exited, or whose status
has not answered for `lost_after_s`, is lost, and `on_lost` is called once with the reason (the
run stops that llama-server: its requests then fail at once, by class, and the run goes on).

A host whose status endpoint did not answer when the watch began (an rpc-server started by hand,
without `quantload rpc-server`) cannot be watched: `unwatched` names it, and a partition there shows
as request timeouts only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import httpx

from quantload.llamacpp.rpc_server import STATUS_PATH, status_port

PROBE_TIMEOUT_S = 1.0
POLL_S = 1.0


def status_url(endpoint: str) -> str:
    """The status endpoint of the rpc-server at HOST:PORT."""
    host, _, port = endpoint.rpartition(":")
    return f"http://{host}:{status_port(int(port))}{STATUS_PATH}"


class RpcWatch:
    """A thread that watches RPC hosts (see the module docstring); `stop` ends it."""

    def __init__(
        self,
        endpoints: Sequence[str],
        lost_after_s: float,
        on_lost: Callable[[str], None],
        poll_s: float = POLL_S,
    ) -> None:
        self.lost_after_s = lost_after_s
        self.on_lost = on_lost
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=PROBE_TIMEOUT_S)
        answered = {endpoint: self._probe(endpoint) for endpoint in endpoints}
        self.watched = tuple(e for e, (ok, _) in answered.items() if ok)
        self.unwatched = tuple(e for e, (ok, _) in answered.items() if not ok)
        self.lost: str | None = None
        self._thread = threading.Thread(target=self._run, name="rpc-watch", daemon=True)

    def start(self) -> RpcWatch:
        if self.watched:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.poll_s + 2 * PROBE_TIMEOUT_S)
        self._client.close()

    def _probe(self, endpoint: str) -> tuple[bool, str | None]:
        """(answered, why the host is lost for sure): an exited rpc-server is lost at once."""
        try:
            response = self._client.get(status_url(endpoint))
        except httpx.HTTPError:
            return False, None
        if response.status_code == 200:
            return True, None
        try:
            code = response.json().get("exit_code")
        except ValueError:
            code = None
        return True, f"the rpc-server at {endpoint} exited (code {code})"

    def _run(self) -> None:
        last_seen = dict.fromkeys(self.watched, time.monotonic())
        while not self._stop.wait(self.poll_s):
            for endpoint in self.watched:
                answered, gone = self._probe(endpoint)
                now = time.monotonic()
                if answered and gone is None:
                    last_seen[endpoint] = now
                    continue
                silent_s = now - last_seen[endpoint]
                if gone is None and silent_s < self.lost_after_s:
                    continue
                reason = gone or (
                    f"the RPC host {endpoint} has not answered for {silent_s:.0f} s (partitioned or down)"
                )
                self.lost = reason
                self.on_lost(reason)
                return
