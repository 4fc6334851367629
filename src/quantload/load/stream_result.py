"""What one streamed request produced, as the client saw it: the raw material of a record."""

from __future__ import annotations

__all__ = ["StreamResult"]

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamResult:
    """One streamed request; times in seconds from the send (perf_counter).

    While the stream is read only `events` is filled: each SSE payload with the arrival time of
    the read that completed it. `quantload.load.openai_chunks.classify_stream` then works out the
    content times, usage, timings and the verdict (`classified` turns true, `events` is emptied).
    """

    sent_unix_s: float = 0.0
    sent_perf_s: float = 0.0
    connect_s: float | None = None
    connection_reused: bool = False
    retried_stale: bool = False
    status: int | None = None
    ttfb_s: float | None = None
    content_times_s: list[float] = field(default_factory=list)  # every chunk of generated text
    answer_s: float | None = None  # the first chunk of answer content (not reasoning)
    reasoning_chunks: int = 0  # chunks that carried reasoning text
    end_s: float | None = None
    done_seen: bool = False
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    empty_chunks: int = 0
    comments: int = 0
    error_class: str | None = None
    error: str | None = None
    n_prompt_tokens: int | None = None  # a context_exceeded refusal: the prompt's tokens
    n_ctx: int | None = None  # and the slot's context, as the server counted them
    bytes_received: int = 0
    reads_kernel_stamped: int = 0  # reads whose time is the kernel's receive time
    reads_read_stamped: int = 0  # reads whose time is when the read returned (see load.arrival)
    events: list[tuple[float, bytes]] = field(default_factory=list, repr=False)
    classified: bool = False

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def ttft_s(self) -> float | None:
        return self.content_times_s[0] if self.content_times_s else None

    @property
    def arrival_clock(self) -> str | None:
        """Where the arrival times came from: "kernel" (every read's receive time), "read" (the
        time each read returned), "mixed", or None when nothing was read."""
        if self.reads_kernel_stamped and self.reads_read_stamped:
            return "mixed"
        if self.reads_kernel_stamped:
            return "kernel"
        return "read" if self.reads_read_stamped else None

    def fail(self, error_class: str, message: str) -> StreamResult:
        """Mark the request failed with `error_class` (see records.ERROR_CLASSES); returns self."""
        self.error_class = error_class
        self.error = message[:300]
        return self
