"""Tables of the server-flag benchmark runs (benchmarks/server_flags_smollm2.py render): what each
measured command was and what the machine was doing, the batching, slots and speculation tables
as summary.json holds them, and per tuned quantization its winner, the winner against the
configured flags, the search's cost (estimated and against the measured full grid) and whether a
second tune picked the same winner."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _n(value: Any, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}{unit}"


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:,.0f} ms"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{value:.0%}"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _head(*columns: str, numeric: str = "") -> list[str]:
    """A Markdown table head; `numeric` marks right-aligned columns with 'r', others '-'."""
    marks = numeric.ljust(len(columns), "-")
    return [_row(*columns), "|" + "|".join("---:" if m == "r" else "---" for m in marks) + "|"]


def run_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = _head(
        "measured",
        "command",
        "exit",
        "wall",
        "load average before → after (1/5/15 min)",
        "other CPU",
        numeric="--rr-r",
    )
    for run in runs:
        before = "/".join(f"{x:.1f}" for x in run["load_before"])
        after = "/".join(f"{x:.1f}" for x in run["load_after"])
        lines.append(
            _row(
                run["name"],
                f"`{' '.join(run['command'])}`",
                run["exit_code"],
                f"{run['wall_s'] / 60:.1f} min",
                f"{before} → {after}",
                _pct(run["other_cpu_frac"]),
            )
        )
    return lines


def _settings(run: dict[str, Any]) -> list[str]:
    return ["```toml", *(f"[{name}] {json.dumps(values)}" for name, values in run["config"].items()), "```"]


def batching_lines(flags: dict[str, Any]) -> list[str]:
    lines = ["### Batching: continuous (-cb) against static (-nocb)", ""]
    lines += [f"**{flags['batching']['verdict']}**", ""]
    lines += _head(
        "batching",
        "part",
        "users / rate",
        "ok",
        "TTFT p50",
        "TTFT p99",
        "ITL p99",
        "output tok/s",
        "goodput req/s",
        "wait p50",
        "wait p99",
        "behind",
        "their wait p50",
        numeric="--rrrrrrrrrrr",
    )
    for r in flags["batching"]["rows"]:
        load = f"{r['users']:.0f} users" if r["phase"] == "closed" else f"{r['rate_rps']:.2f}/s"
        lines.append(
            _row(
                r["server_args"],
                r["phase"],
                load,
                f"{r['ok']}/{r['requests']}",
                _ms(r["ttft_p50_s"]),
                _ms(r["ttft_p99_s"]),
                _ms(r["itl_p99_s"]),
                _n(r["output_tok_s"]),
                _n(r["goodput_rps"], 2),
                _ms(r["wait_p50_s"]),
                _ms(r["wait_p99_s"]),
                r["behind"],
                _ms(r["behind_wait_p50_s"]),
            )
        )
    return lines


def slots_lines(flags: dict[str, Any]) -> list[str]:
    lines = ["### Slots at a fixed KV budget", "", f"**{flags['slots']['verdict']}**", ""]
    lines += _head(
        "-np",
        "tokens per slot",
        "KV MiB exact",
        "KV MiB reported",
        "limit users",
        "misses from",
        "goodput req/s",
        "refused / cut",
        "needs more",
        numeric="rrrrr-rrr",
    )
    for r in flags["slots"]["rows"]:
        lines.append(
            _row(
                r["slots"],
                f"{r['ctx_per_slot']:,}",
                _n(r["kv_predicted_mib"], 2),
                _n(r["kv_reported_mib"], 2),
                _n(r["limit_users"], 0),
                str(r.get("lowest_miss") if r.get("lowest_miss") is not None else "–"),
                _n(r["goodput_rps"], 2),
                f"{r['refused']} / {r['cut']} of {r['requests']}",
                _pct(r["need_over_frac"]),
            )
        )
    return lines


def speculation_lines(flags: dict[str, Any]) -> list[str]:
    lines = ["### Speculative decoding", "", f"**{flags['speculation']['verdict']}**", ""]
    lines += _head(
        "speculation",
        "traffic",
        "users",
        "requests",
        "TPOT p50",
        "decode tok/s p50",
        "speed-up",
        "drafted/request",
        "accepted (timings)",
        "accepted (/metrics)",
        "speculating",
        numeric="--rrrrrrrr-",
    )
    for r in flags["speculation"]["rows"]:
        speedup = "–" if r["decode_speedup"] is None else f"x{r['decode_speedup']:.2f}"
        said = "off" if r["speculating"] is None else ("yes" if r["speculating"] else f"NO ({r['why']})")
        lines.append(
            _row(
                r["variant"],
                r["traffic"],
                r["users"],
                r["requests"],
                _ms(r["tpot_p50_s"]),
                _n(r["decode_tok_s_p50"]),
                speedup,
                _n(r["drafted_per_request"]),
                _pct(r["acceptance"]),
                _pct(r["server_acceptance"]),
                said,
            )
        )
    return lines


def experiment_lines(
    run_dir: Path, parts: tuple[str, ...] = ("batching", "slots", "speculation")
) -> list[str]:
    flags = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["server_flags"]
    makers = {"batching": batching_lines, "slots": slots_lines, "speculation": speculation_lines}
    lines: list[str] = []
    for part in parts:
        lines += [*makers[part](flags), ""]
    return lines


def _measured(run: dict[str, Any] | None) -> bool:
    """Whether a measured command ended with a tune.json to read."""
    return bool(run and run.get("run_dir") and (Path(run["run_dir"]) / "tune.json").is_file())


def _tune(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "tune.json").read_text(encoding="utf-8"))["quants"]
    return data


def _winner(key: str | None) -> str:
    """A tune's winner as the table shows it: none when no configuration beat the configured flags."""
    return key if key else "none (no configuration beat the configured flags)"


def _ranking(name: str, quant: str, outcome: dict[str, Any]) -> list[str]:
    lines = ["", f"{name}, {quant}: configurations, best first", ""]
    lines += _head(
        "#",
        "configuration",
        "rung",
        "limit",
        "misses from",
        "goodput req/s",
        "memory MiB",
        "trials s",
        numeric="r-rr-rrr",
    )
    for r in outcome["ranking"]:
        lines.append(
            _row(
                r["rank"],
                r["key"],
                r["rung"] + 1,
                _n(r["limit"], 0),
                str(r.get("lowest_miss") if r.get("lowest_miss") is not None else "–"),
                _n(r["goodput_rps"], 2),
                _n(r["memory_mib"], 0),
                _n(r["seconds"], 0),
            )
        )
    if outcome.get("command"):
        lines += ["", f"winner command: `{outcome['command']}`"]
    return lines


def tune_lines(runs: dict[str, dict[str, Any]], seconds: list[dict[str, Any]]) -> list[str]:
    """The tune tables: `runs` by name, `seconds` every second tune (one per quantization when
    they were measured apart)."""
    first = _tune(Path(runs["tune-1"]["run_dir"]))
    second: dict[str, Any] = {}
    for run in seconds:
        second.update(_tune(Path(run["run_dir"])) if _measured(run) else {})
    grid = _tune(Path(runs["grid"]["run_dir"])) if _measured(runs.get("grid")) else {}
    lines = _head(
        "quant", "winner (tune 1)", "its limit", "against the configured flags", "search", "tune 2's winner"
    )
    for quant, outcome in first.items():
        against = outcome.get("against_baseline") or {}
        again = _winner(second[quant]["winner"]) if quant in second else None
        ratios = (
            f"limit x{_n(against.get('limit_ratio'), 2)} ({_n(against.get('winner_limit'), 0)} against"
            f" {_n(against.get('baseline_limit'), 0)}), goodput x{_n(against.get('goodput_ratio'), 2)}"
        )
        same = (
            "not measured" if again is None else "the same" if again == _winner(outcome["winner"]) else again
        )
        lines.append(
            _row(
                quant,
                _winner(outcome["winner"]),
                _n(against.get("winner_limit"), 0),
                ratios,
                outcome["cost"]["sentence"],
                same,
            )
        )
    for quant, outcome in grid.items():
        mine = first.get(quant, {})
        grid_s, tune_s = outcome["cost"]["seconds"], mine.get("cost", {}).get("seconds")
        share = _pct(tune_s / grid_s if tune_s and grid_s else None)
        picked = "the same winner" if mine.get("winner") == outcome["winner"] else mine.get("winner")
        lines += [
            "",
            f"Full grid of {quant} (every configuration confirmed, `tune.finalists = 8`): best"
            f" {outcome['winner']}, {outcome['cost']['trials']} trials in {grid_s / 60:.1f} min; successive"
            f" halving took {_n(tune_s / 60 if tune_s else None)} min ({share} of it) and picked {picked}.",
        ]
    for name, data in (("tune 1", first), ("tune 2", second), ("full grid", grid)):
        for quant, outcome in data.items():
            lines += _ranking(name, quant, outcome)
    return lines


def predicted_lines(plain: dict[str, Any], predicted: dict[str, Any]) -> list[str]:
    """`quantload tune` without and with `--predict-first`, per quantization: the time the search
    took, its trials, the winner and its limit, and the configurations the prediction dropped."""
    lines = _head(
        "quant", "tune", "search", "trials", "winner", "its limit", "screened out", numeric="--rr-r-"
    )
    for quant, outcome in plain.items():
        rows = [("without prediction", outcome)]
        if quant in predicted:
            rows.append(("--predict-first", predicted[quant]))
        for name, data in rows:
            against = data.get("against_baseline") or {}
            dropped = [r for r in data["ranking"] if r.get("screened")]
            lines.append(
                _row(
                    quant, name, f"{data['cost']['seconds'] / 60:.1f} min", data["cost"]["trials"],
                    _winner(data["winner"]), _n(against.get("winner_limit"), 0), len(dropped) or "–",
                )
            )  # fmt: skip
    for quant, outcome in predicted.items():
        lines += [
            "",
            f"--predict-first, {quant}: each configuration's prediction against what was measured",
            "",
        ]
        lines += _head("configuration", "predicted", "interval", "measured limit", "why", numeric="-rrr-")
        for r in outcome["ranking"]:
            interval = f"{_n(r.get('predicted_low'), 0)}-{_n(r.get('predicted_high'), 0)}"
            measured = "not run" if r.get("screened") else _n(r["limit"], 0)
            lines.append(
                _row(r["key"], _n(r.get("predicted_limit"), 0), interval, measured, r.get("why") or "")
            )
    return lines


def render_runs(runs: list[dict[str, Any]], figures: Path) -> Path:
    by_name = {run["name"]: run for run in runs}
    lines = ["# Server flags on SmolLM2-135M (issue 22)", "", *run_lines(runs), ""]
    resumed = [run["name"] for run in runs if "--resume" in run["command"]]
    if resumed:
        lines += [
            f"{', '.join(resumed)} went on with an interrupted tune (`--resume`): its wall time is the"
            " part after the resume; the trials before it were taken as measured and count in the"
            " search's own cost below.",
            "",
        ]
    if "experiments" in by_name and by_name["experiments"]["run_dir"]:
        lines += ["## The experiments (Q8_0)", "", *_settings(by_name["experiments"]), ""]
        lines += experiment_lines(Path(by_name["experiments"]["run_dir"]))
    if "loaded" in by_name and by_name["loaded"]["run_dir"]:
        lines += ["", "## Batching and speculation at 4 users (Q8_0)", "", *_settings(by_name["loaded"]), ""]
        lines += experiment_lines(Path(by_name["loaded"]["run_dir"]), ("batching", "speculation"))
    if _measured(by_name.get("tune-1")) and _measured(by_name.get("tune-predicted")):
        plain, predicted = (_tune(Path(by_name[name]["run_dir"])) for name in ("tune-1", "tune-predicted"))
        lines += ["", f"## quantload tune with and without prediction ({', '.join(plain)})", ""]
        lines += [*_settings(by_name["tune-1"]), "", *predicted_lines(plain, predicted)]
        for name, data in (("without prediction", plain), ("--predict-first", predicted)):
            for quant, outcome in data.items():
                lines += _ranking(name, quant, outcome)
    elif _measured(by_name.get("tune-1")):
        quants = ", ".join(_tune(Path(by_name["tune-1"]["run_dir"])))
        lines += ["", f"## quantload tune ({quants})", "", *_settings(by_name["tune-1"]), ""]
        lines += tune_lines(by_name, [run for run in runs if run["name"] == "tune-2"])
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    path = figures / f"server-flags-smollm2-135m-{stamp}.md"
    text = "\n".join(lines) + "\n"
    for run in runs:  # no machine paths: the run folders and the cache become placeholders
        if run["run_dir"]:
            text = text.replace(str(Path(run["run_dir"]).parent.parent.parent), "<work>")
    text = text.replace(str(Path.home()), "~")
    path.write_text(text, encoding="utf-8")
    print(text)
    return path
