"""Is the predicted limit the one the load measures? `quantload predict` against a decided limit
search, configuration by configuration, on real llama-servers (issue 36).

For each configuration (quantization, slots, -b/-ub, threads, workload of short or long prompts)
the same settings go, as QUANTLOAD_* variables, to `quantload predict` (its cost curves measured
once per file and flags, kept in OUT/costs/) and to `quantload load -e limit_users` against a
llama-server started with those flags. Prints, and writes to OUT/table.md, one row per
configuration: the predicted limit and its interval, the measured (decided) limit and where its
misses begin, and whether the measured limit lies in the interval and within one user.

    .venv/bin/python benchmarks/predict_vs_measured.py [--model smollm2-135m] [--only 1,4,7]
        [--time-cap 900] [--out results/bench-predict]
    .venv/bin/python benchmarks/predict_vs_measured.py --levels [--out results/bench-predict]

`--levels` measures nothing: it prints, for every configuration measured under OUT, each level's
measured TTFT and TPOT at the SLO's percentile (all non-warm-up requests of that many users, over
the search's trials) beside the prediction at that level, and the first level where they part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.config import ToolchainSettings
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.load.limit_file import LimitLine, read_limits
from quantload.load.records import iter_records
from quantload.models.prepared import prepared_folder
from quantload.paths import cache_root
from quantload.stats import percentile

SLO = {
    "ttft_s": "3", "tpot_s": "0.2", "ttft_percentile": "p90", "tpot_percentile": "p90",
    "max_failed_frac": "0.1",
}  # fmt: skip
# Long prompts take 2-3 s of prefill each on one thread: against the short prompts' TTFT 3 s at p90
# even one user sits on the limit (undecided), so they have an SLO of their own, at the median (a
# p50 is decided after a few requests a level, where a p90 at 3 s a request needs minutes).
LONG_SLO = {
    "ttft_s": "8", "tpot_s": "0.5", "ttft_percentile": "p50", "tpot_percentile": "p50",
    "max_failed_frac": "0.1",
}  # fmt: skip
SHORT_TIME_CAP_S = 900.0
LONG_TIME_CAP_S = 420.0
SHORT = ("lengths", "uniform:64-192", "fixed:32")
LONG = ("lengths", "uniform:512-1024", "fixed:32")


@dataclass(frozen=True)
class Config:
    quant: str
    slots: int
    batch: int
    ubatch: int
    threads: int
    workload: tuple[str, str, str]

    def label(self) -> str:
        kind = "short" if self.workload == SHORT else "long"
        return f"{self.quant} np{self.slots} b{self.batch}/{self.ubatch} t{self.threads} {kind}"

    def time_cap_s(self) -> float:
        """The search's time cap: long prompts' levels take longer, and their search is cut sooner."""
        return LONG_TIME_CAP_S if self.workload == LONG else SHORT_TIME_CAP_S

    def environ(self, level_max_s: float, time_cap_s: float) -> dict[str, str]:
        kind, inputs, outputs = self.workload
        settings = {
            "QUANTLOAD_SERVER__SLOTS": str(self.slots),
            "QUANTLOAD_SERVER__CTX_PER_SLOT": "2048",
            "QUANTLOAD_SERVER__THREADS": str(self.threads),
            "QUANTLOAD_SERVER__EXTRA_ARGS": json.dumps(["-b", str(self.batch), "-ub", str(self.ubatch)]),
            "QUANTLOAD_WORKLOAD__KIND": kind,
            "QUANTLOAD_WORKLOAD__INPUT_LENGTHS": inputs,
            "QUANTLOAD_WORKLOAD__OUTPUT_LENGTHS": outputs,
            "QUANTLOAD_WORKLOAD__REQUESTS": "40",  # a trial starts with these, more while undecided
            "QUANTLOAD_SLO__LEVEL_MAX_S": str(level_max_s),
            "QUANTLOAD_LIMIT__TIME_CAP_S": str(time_cap_s),  # the predicted search's cap, as the load's
        }
        slo = LONG_SLO if self.workload == LONG else SLO
        settings.update({f"QUANTLOAD_SLO__{key.upper()}": value for key, value in slo.items()})
        return {**os.environ, **settings}


CONFIGS: tuple[Config, ...] = (
    *(Config("Q4_K_M", slots, 2048, 512, 1, SHORT) for slots in (1, 2, 4, 8)),
    *(Config("Q4_K_M", slots, 2048, 512, 1, LONG) for slots in (2, 4, 8)),
    *(Config("Q8_0", slots, 2048, 512, 1, SHORT) for slots in (2, 4, 8)),
    *(Config("Q8_0", slots, 2048, 512, 1, LONG) for slots in (4, 8)),
    *(Config("F16", slots, 2048, 512, 1, SHORT) for slots in (2, 4, 8)),
    Config("F16", 4, 2048, 512, 1, LONG),
    Config("Q4_K_M", 4, 256, 256, 1, SHORT),
    Config("Q4_K_M", 4, 256, 256, 1, LONG),
    Config("Q8_0", 4, 256, 128, 1, LONG),
    Config("Q4_K_M", 4, 2048, 512, 2, SHORT),
)


def quantload(args: list[str], environ: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "quantload.cli.main", *args]
    return subprocess.run(
        command, env=environ, timeout=timeout_s, capture_output=True, text=True, check=False
    )


def predicted(
    config: Config, model: Path, out: Path, environ: dict[str, str], predictions: str = "predict"
) -> dict[str, Any]:
    costs = out / "costs" / f"{config.quant}-b{config.batch}-ub{config.ubatch}-t{config.threads}.json"
    folder = out / predictions / _folder_name(config)
    args = ["predict", str(model), "--out", str(folder), "--max-users", "32"]
    if costs.exists():
        args += ["--costs", str(costs)]
    done = quantload(args, environ, 1800)
    if done.returncode != 0:
        raise SystemExit(f"predict failed for {config.label()}: {done.stderr.strip()[-400:]}")
    measured = next(folder.glob("costs-*.json"), None)
    if measured is not None and not costs.exists():
        costs.parent.mkdir(parents=True, exist_ok=True)
        costs.write_bytes(measured.read_bytes())
    (prediction,) = json.loads((folder / "predict.json").read_text())["predictions"].values()
    limit: dict[str, Any] = prediction["limit"]
    return limit


def measured(config: Config, model: Path, out: Path, environ: dict[str, str], time_cap_s: float) -> LimitLine:
    """The limit search's line: its decided limit, where its misses begin, its undecided levels."""
    toolchain = ensure_toolchain(ToolchainSettings(), os.environ)
    folder = out / "load" / _folder_name(config)
    spec = ServerSpec(
        model_path=model, alias=config.quant, slots=config.slots, ctx_per_slot=2048, threads=config.threads,
        extra_args=("-b", str(config.batch), "-ub", str(config.ubatch)),
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    with LlamaServer(toolchain, spec, folder / "llama-server.log") as server:
        args = [
            "load", "--url", server.url, "--name", "bench", "--quant", config.quant, "--out", str(folder),
            "--metrics-port", "0", "-e", "limit_users", "--time-cap", str(time_cap_s),
        ]  # fmt: skip
        quantload(args, environ, time_cap_s + 600)
    lines = read_limits(folder / "limits.jsonl")
    if not lines:
        raise SystemExit(f"the limit search of {config.label()} wrote no line: see {folder}")
    return lines[-1]


def _folder_name(config: Config) -> str:
    return config.label().replace(" ", "_").replace("/", "-")


def level_rows(out: Path, predictions: str = "predict") -> list[str]:
    """Per level, measured against predicted TTFT and TPOT at the SLO's percentile (p90; long prompts
    p50), for every configuration with both a prediction and a load under `out`; "parts" marks a
    level where either differs by more than a quarter."""
    rows = [
        "| # | users | requests | TTFT measured | TTFT predicted | TPOT measured | TPOT predicted | parts |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for number, config in enumerate(CONFIGS, start=1):
        predict_json = out / predictions / _folder_name(config) / "predict.json"
        records_jsonl = out / "load" / _folder_name(config) / "records.jsonl"
        if not (predict_json.is_file() and records_jsonl.is_file()):
            continue
        (prediction,) = json.loads(predict_json.read_text(encoding="utf-8"))["predictions"].values()
        predicted = {int(level["level"]): level for level in prediction["limit"]["levels"]}
        for users, (count, ttft, tpot) in measured_levels(config, records_jsonl).items():
            level = predicted.get(users, {})
            p_ttft, p_tpot = level.get("ttft_s"), level.get("tpot_s")
            parts = [
                name
                for name, got, said in (("TTFT", ttft, p_ttft), ("TPOT", tpot, p_tpot))
                if got is not None and said is not None and abs(got - said) > 0.25 * said
            ]
            cells = (
                number,
                users,
                count,
                _s(ttft),
                _s(p_ttft),
                _ms(tpot),
                _ms(p_tpot),
                ", ".join(parts),
            )
            rows.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return rows


def measured_levels(config: Config, records_jsonl: Path) -> dict[int, tuple[int, float | None, float | None]]:
    """Per users level (all trials of it): requests, and TTFT and TPOT at the SLO's percentile
    (p90; long prompts p50), of the non-warm-up requests that succeeded."""
    by_users: dict[int, list[tuple[float, float | None]]] = {}
    for record in iter_records(records_jsonl):
        if record.warmup or not record.ok or record.ttft_s is None or record.stage_users is None:
            continue
        by_users.setdefault(record.stage_users, []).append((record.ttft_s, record.tpot_s))
    q = 50 if config.workload == LONG else 90  # the SLO's percentile, as the prediction's
    found = {}
    for users in sorted(by_users):
        ttfts = [ttft for ttft, _ in by_users[users]]
        tpots = [tpot for _, tpot in by_users[users] if tpot is not None]
        found[users] = (len(ttfts), percentile(ttfts, q), percentile(tpots, q) if tpots else None)
    return found


def estimated_limit(config: Config, out: Path) -> tuple[float, float]:
    """The limit the measured percentiles show without the verdict's confidence, as a range: from
    the highest level tried whose TTFT and TPOT at the SLO's percentile are within the limits (every
    lower level tried meeting too) to one below the lowest that is not ((4, 7): meets at 4, over
    from 8; 0: not even the lowest level; inf: none over)."""
    slo = LONG_SLO if config.workload == LONG else SLO
    ttft_limit, tpot_limit = float(slo["ttft_s"]), float(slo["tpot_s"])
    meets = 0.0
    levels = measured_levels(config, out / "load" / _folder_name(config) / "records.jsonl")
    for users, (_, ttft, tpot) in levels.items():
        if (ttft is not None and ttft > ttft_limit) or (tpot is not None and tpot > tpot_limit):
            return meets, float(users - 1)
        meets = float(users)
    return meets, math.inf


def _range(low: float, high: float) -> str:
    return f"{low:g}" if low == high else f"{low:g}+" if high == math.inf else f"{low:g}-{high:g}"


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f} s"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f} ms"


TABLE_HEAD = (
    "| # | configuration | predicted | interval | percentiles meet | interval meets them"
    " | search predicted | its interval | measured (decided) | undecided | misses from"
    " | in search interval | search within 1 | in interval |\n"
    "|---:|---|---:|---|---|---|---:|---|---:|---|---:|---|---|---|"
)


def table_row(
    number: int, config: Config, limit: dict[str, Any], line: LimitLine, estimate: tuple[float, float]
) -> str:
    """One configuration's row. "percentiles meet": `estimated_limit`, and whether the predicted
    interval meets that range. "search predicted": the limit the search is predicted to show with
    the benchmark's level budget and time cap (quantload.predict.search), with its interval from
    the slowest and the fastest cost; "in search interval" and "search within 1": the decided
    limit against those; "in interval": the decided limit against the percentile limit's
    interval."""
    low, point, high = (_number(limit[key]) for key in ("limit_low", "limit", "limit_high"))
    s_low, s_point, s_high = (
        _number((limit.get(key) or {}).get("limit")) for key in ("search_low", "search", "search_high")
    )
    value, miss = line.limit, line.lowest_miss
    agrees = low is not None and high is not None and estimate[0] <= high and low <= estimate[1]
    in_search = _within(value, s_low, s_high)
    search_close = (value or 0) == (s_point or 0) or (
        value is not None and s_point is not None and abs(value - s_point) <= 1
    )
    undecided = ", ".join(f"{level:g}" for level in line.undecided) or "–"
    cells = (
        number, config.label(), _g(point), f"{_g(low)}-{_g(high)}", _range(*estimate), _yes(agrees),
        _g(s_point), f"{_g(s_low)}-{_g(s_high)}", _g(value), undecided, _g(miss),
        _yes(in_search), _yes(search_close), _yes(_within(value, low, high)),
    )  # fmt: skip
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _within(value: float | None, low: float | None, high: float | None) -> bool:
    """`value` in [low, high], where None (no level shown to meet) sits below every level."""
    ranked = [-1.0 if v is None else v for v in (value, low, high)]
    return ranked[1] <= ranked[0] <= ranked[2]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _g(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--only", default="", help="1-based configuration numbers, e.g. 1,4,7")
    parser.add_argument(
        "--time-cap", type=float, default=None,
        help=f"seconds per limit search [{SHORT_TIME_CAP_S:g}; long prompts {LONG_TIME_CAP_S:g}]",
    )  # fmt: skip
    parser.add_argument("--level-max-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=Path("results/bench-predict"))
    parser.add_argument(
        "--levels", action="store_true", help="print the per-level table of OUT; measure nothing"
    )
    parser.add_argument(
        "--predict-only", metavar="DIR",
        help="predict again into OUT/DIR from the stored costs (with this environment's QUANTLOAD_*"
        " settings) and set it against the limits already measured under OUT; no load",
    )  # fmt: skip
    args = parser.parse_args()
    if args.levels:
        print("\n".join(level_rows(args.out, args.predict_only or "predict")))
        return
    picked = [int(n) for n in args.only.split(",") if n] or list(range(1, len(CONFIGS) + 1))
    folder = prepared_folder(cache_root(None, os.environ), args.model)
    rows = TABLE_HEAD.splitlines()
    for number in picked:
        config = CONFIGS[number - 1]
        model = next(folder.glob(f"*-{config.quant}.gguf"), None)
        if model is None:
            hint = f"run `quantload prepare --model {args.model}`"
            raise SystemExit(f"no {config.quant} file in {folder}: {hint}")
        time_cap_s = args.time_cap or config.time_cap_s()
        environ = config.environ(args.level_max_s, time_cap_s)
        started = time.monotonic()
        if args.predict_only:
            lines = read_limits(args.out / "load" / _folder_name(config) / "limits.jsonl")
            if not lines:
                continue
            limit = predicted(config, model, args.out, environ, args.predict_only)
            line = lines[-1]
        else:
            limit = predicted(config, model, args.out, environ)
            line = measured(config, model, args.out, environ, time_cap_s)
        rows.append(table_row(number, config, limit, line, estimated_limit(config, args.out)))
        took = f"({time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.2f})"
        print(rows[-1], took, flush=True)
        args.out.mkdir(parents=True, exist_ok=True)  # each row kept as soon as it is measured
        table = f"table-{args.predict_only}.md" if args.predict_only else "table.md"
        (args.out / table).write_text("\n".join(rows) + "\n", encoding="utf-8")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
