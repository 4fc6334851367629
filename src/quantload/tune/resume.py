"""Going on with a tune from its tune.jsonl (`quantload tune --resume`), trusting nothing in it.

The state is read line by line (quantload.tune.state_file): a line that does not parse is counted
and named by its number. The quantization's latest search must be of the same model file
(`model_identity`: its source, name and content hash) and the same space, workload and SLO
(`space_key`), or the resume is refused in one line before any trial. The search then takes every
trial line it plans (an entrant of a rung whose entrants are decided), wherever the line stands in
the file, and again after each trial it measures anew (a later rung's line waits until its rung
is decided); what it still lacks is measured again, and a line it never plans (a configuration or
rung it does not have, a repeat) is left out and counted. What was left out is said in notes the caller shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantload.errors import ConfigError
from quantload.rundir.jsonl import BadLines
from quantload.tune.halving import SuccessiveHalving
from quantload.tune.state_file import TuneLine, lines_of, read_tune

SHOWN_KEYS = 3  # configurations a note names; the rest are counted


@dataclass(frozen=True)
class Resumed:
    """What a resume takes from the state: its lines, the trials the search took, the baseline."""

    lines: tuple[TuneLine, ...]
    trials: tuple[TuneLine, ...]
    baseline: TuneLine | None
    notes: tuple[str, ...]
    pending: tuple[TuneLine, ...] = ()  # trial lines the search does not plan yet

    @classmethod
    def nothing(cls) -> Resumed:
        """A tune that starts afresh."""
        return cls((), (), None, ())


def take_planned(search: SuccessiveHalving, offered: list[TuneLine]) -> list[TuneLine]:
    """Record every line of `offered` the search plans now (taking them out of `offered`)."""
    taken: list[TuneLine] = []
    while (line := next((t for t in offered if search.accepts(str(t.key), t.rung or 0)), None)) is not None:
        offered.remove(line)
        search.record(line.score())
        taken.append(line)
    return taken


def left_out_note(left_out: list[TuneLine], path: Path) -> str | None:
    """The note on trial lines the search never planned (None: every line was taken)."""
    if not left_out:
        return None
    named = ", ".join(f"{line.key} (rung {(line.rung or 0) + 1})" for line in left_out[:SHOWN_KEYS])
    more = f" and {len(left_out) - SHOWN_KEYS} more" if len(left_out) > SHOWN_KEYS else ""
    return (
        f"{len(left_out)} trial line(s) of {path.name} do not fit this search (an unknown configuration"
        f" or rung, a repeat, or past a damaged line): {named}{more}; left out"
    )


def resumable_lines(
    path: Path, quant: str, model: str, key: str, bad: BadLines | None = None
) -> list[TuneLine]:
    """The lines of `quant`'s latest search in `path`; ConfigError when it tuned another model
    file, space, workload or SLO."""
    lines = lines_of(read_tune(path, bad), quant)
    if lines:
        start = lines[0]
        if start.model is not None and start.model != model:
            raise ConfigError(
                f"the tune of {quant} in {path} is of another model file ({start.model}; now {model})",
                "resume it with the model it tuned (--model), or start a new tune",
            )
        if start.space_key != key:
            raise ConfigError(
                f"the tune of {quant} in {path} searched another model, space, workload or SLO"
                f" (key {start.space_key}, now {key})",
                "resume with the settings it started with, or start a new tune",
            )
    return lines


def resume_tune(path: Path, quant: str, model: str, key: str, search: SuccessiveHalving) -> Resumed:
    """The state of `quant`'s tune in `path`, its trials recorded into `search` (see the module
    docstring); ConfigError when it tuned another model file, space, workload or SLO."""
    bad = BadLines(path.name)
    lines = resumable_lines(path, quant, model, key, bad)
    offered = [line for line in lines if line.kind == "trial"]
    taken = take_planned(search, offered)
    notes = [note for note in (bad.note(),) if note is not None]
    baseline = next((line for line in lines if line.kind == "baseline"), None)
    return Resumed(tuple(lines), tuple(taken), baseline, tuple(notes), tuple(offered))
