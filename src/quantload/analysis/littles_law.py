"""Little's law as a consistency check: throughput x mean latency against requests in flight.

For each complete closed- or open-loop stage, over its steady window (from the moment every user
has sent its first request to the last send, so ramp-up and drain do not count):

  lambda  = requests completed inside the window / window length     (req/s)
  W       = mean end-to-end latency of those requests                 (s)
  L       = time-averaged requests in flight, from the records' send and end times
  L_server = mean of llama-server's requests_processing (+ requests_deferred) over the window,
             from Prometheus

In a steady state lambda x W equals L. A difference above 10 % says the stage was not steady
(too short, warming up) or that time was spent outside what the other side counts (client
overhead, network, the server's HTTP queue).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from quantload.analysis.stage_tables import USABLE
from quantload.analysis.stats import relative_diff

TOLERANCE = 0.10
MIN_COMPLETED = 5  # fewer completions in the window: too few to judge
MIN_SCRAPES = 3  # fewer scrapes inside the window: the server mean is too coarse to judge
EXPERIMENTS = ("sweep", "open_loop")  # the experiments' names: the stages checked


@dataclass(frozen=True)
class Window:
    """The part of a stage the check looks at (unix seconds)."""

    stage_id: str
    start_unix_s: float
    end_unix_s: float
    steady: bool

    @property
    def length_s(self) -> float:
        return self.end_unix_s - self.start_unix_s


@dataclass(frozen=True)
class ServerInFlight:
    """Mean requests processing (and deferred) inside one window, and how many scrapes it rests on."""

    processing: float
    deferred: float | None
    samples: int

    @property
    def total(self) -> float:
        return self.processing + (self.deferred or 0.0)


def _stage_records(records: pd.DataFrame, stage_id: str) -> pd.DataFrame:
    chosen = records[(records["stage_id"] == stage_id) & ~records["warmup"] & records["ok"]]
    return chosen.dropna(subset=["sent_unix_s", "end_unix_s"])


def stage_windows(records: pd.DataFrame, stages: pd.DataFrame) -> list[Window]:
    """The steady window of every complete sweep or open-loop stage (whole span when too short)."""
    windows: list[Window] = []
    if stages.empty:
        return windows
    for stage in stages.itertuples():
        if stage.experiment not in EXPERIMENTS or stage.status not in USABLE:
            continue
        frame = _stage_records(records, str(stage.stage_id))
        if len(frame) < 2:
            continue
        sends = sorted(frame["sent_unix_s"].tolist())
        users = stage.users if stage.experiment == "sweep" and pd.notna(stage.users) else None
        start = sends[int(users) - 1] if users is not None and 1 <= users < len(sends) else sends[0]
        end = sends[-1]
        if end > start:
            windows.append(Window(str(stage.stage_id), start, end, True))
        else:
            windows.append(Window(str(stage.stage_id), sends[0], float(frame["end_unix_s"].max()), False))
    return windows


def _client_side(frame: pd.DataFrame, window: Window) -> tuple[int, float | None, float | None, float]:
    inside = frame[(frame["end_unix_s"] > window.start_unix_s) & (frame["end_unix_s"] <= window.end_unix_s)]
    completed = len(inside)
    rate = completed / window.length_s if completed else None
    latency = float(inside["e2e_s"].mean()) if completed else None
    begin = frame["sent_unix_s"].clip(lower=window.start_unix_s)
    finish = frame["end_unix_s"].clip(upper=window.end_unix_s)
    busy = float((finish - begin).clip(lower=0.0).sum())
    return completed, rate, latency, busy / window.length_s


def littles_law_table(
    records: pd.DataFrame,
    stages: pd.DataFrame,
    windows: Sequence[Window],
    server: Mapping[str, ServerInFlight],
) -> pd.DataFrame:
    """One row per window: lambda, W, lambda x W, L (client), L (server), differences, flag."""
    rows: list[dict[str, Any]] = []
    by_id = {str(s["stage_id"]): s for s in stages.to_dict("records")} if not stages.empty else {}
    for window in windows:
        stage = by_id.get(window.stage_id, {})
        frame = _stage_records(records, window.stage_id)
        completed, rate, latency, in_flight = _client_side(frame, window)
        predicted = rate * latency if rate is not None and latency is not None else None
        found = server.get(window.stage_id)
        client_diff = relative_diff(predicted, in_flight)
        server_diff = relative_diff(predicted, found.total) if found else None
        flags = []
        if completed < MIN_COMPLETED:
            flags.append(f"too few requests (<{MIN_COMPLETED}) to judge")
        elif client_diff is not None and abs(client_diff) > TOLERANCE:
            flags.append("client")
        if found is not None and found.samples < MIN_SCRAPES:
            flags.append(f"too few scrapes (<{MIN_SCRAPES}) for the server side")
        elif completed >= MIN_COMPLETED and server_diff is not None and abs(server_diff) > TOLERANCE:
            flags.append("server")
        rows.append(
            {
                "stage_id": window.stage_id,
                "quant": stage.get("quant"),
                "experiment": stage.get("experiment"),
                "users": stage.get("users"),
                "rate_rps": stage.get("rate_rps"),
                "repeat": stage.get("repeat"),
                "window_s": window.length_s,
                "steady_window": window.steady,
                "completed": completed,
                "throughput_rps": rate,
                "mean_latency_s": latency,
                "predicted_in_flight": predicted,
                "client_in_flight": in_flight,
                "server_processing": found.processing if found else None,
                "server_deferred": found.deferred if found else None,
                "server_samples": found.samples if found else 0,
                "client_diff": client_diff,
                "server_diff": server_diff,
                "flagged": ", ".join(f for f in flags if f in ("client", "server")),
                "unjudged": "; ".join(f for f in flags if f not in ("client", "server")),
            }
        )
    return pd.DataFrame(rows)
