"""The Locust user class: a plain `User` streaming the tickets its process's runtime hands out.

No HttpUser/FastHttpUser: their stream reading was either slow to set up or buffered small SSE
events. Each task takes the next ticket from the process's runtime and streams it with
quantload's own socket client (`quantload.load.client`).
"""

from __future__ import annotations

from typing import ClassVar

import gevent
from locust import User, constant, task
from locust.env import Environment

from quantload.load.in_locust.runtime import LoadRuntime, UserState

IDLE_WHEN_NO_TICKETS_S = 0.5


class StreamingChatUser(User):
    """A user that streams chat completions handed to it by the process's runtime."""

    abstract = True
    wait_time = constant(0)
    runtime: ClassVar[LoadRuntime | None] = None

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.state = UserState()

    @task
    def stream(self) -> None:
        """Send ticket after ticket, with no pause in between; idle briefly when there is none.

        The loop stays inside one task on purpose: going back to Locust's task scheduler after
        every request would add a scheduling round (and a wait) between requests, which at
        hundreds of users shows up as less concurrency than asked.
        """
        runtime = type(self).runtime
        while runtime is not None:
            ticket = runtime.take(self.state)
            if ticket is None:
                break
            runtime.execute(ticket, self.state)
        gevent.sleep(IDLE_WHEN_NO_TICKETS_S)
