"""Every setting takes only finite numbers within its range, checked in one place (config.py), and
refused in one line: whatever value of whatever type reaches it, through load_config or through a
command's flags, the outcome is settings or one ConfigError line, never a traceback.

Hypothesis draws values by each field's declared type (numbers include inf, nan, huge and tiny
ones) and across types; the example count is QUANTLOAD_FUZZ_EXAMPLES (200), derandomized.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr

from quantload.analysis.capacity_plan import MeasuredLimit, costs, servers_for
from quantload.cli import cmd_report
from quantload.cli.main import main
from quantload.config import MAX_USERS, PlanSettings, Settings, TenantSettings, load_config
from quantload.errors import ConfigError, QuantloadError
from quantload.experiments.noisy_neighbour.tables import tenant_slo
from quantload.load.lengths import parse_length_distribution
from quantload.load.limit_search import LimitSearch, Trial
from quantload.load.processes import choose_workers, usable_cores
from quantload.slo import Slo
from quantload.stack import run_steps

EXAMPLES = int(os.environ.get("QUANTLOAD_FUZZ_EXAMPLES", "200"))
BOUNDED = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324, 0.0, -0.0, 1e12, 1e19]),
    st.integers(min_value=-(2**70), max_value=2**70),
)
ANYTHING = st.one_of(NUMBERS, st.booleans(), st.text(max_size=12), st.none(), st.lists(NUMBERS, max_size=3))


def values_for(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of a field's declared type (and of nearby types), edge cases included."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return values_for(args[0])
    if origin in (types.UnionType, typing.Union):
        return st.one_of(*(values_for(arg) for arg in args))
    if origin is Literal:
        return st.one_of(st.sampled_from(args), st.text(max_size=8))
    if origin in (tuple, list):
        inner = values_for(args[0]) if args else ANYTHING
        return st.lists(inner, max_size=4).map(tuple)
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.one_of(st.booleans(), st.sampled_from(["yes", "2", 2]))
    if annotation in (int, float):
        return NUMBERS
    if annotation in (str, Path, SecretStr):
        return st.text(max_size=24)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):  # a nested table
        fields = annotation.model_fields
        return st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True).flatmap(
            lambda keys: st.fixed_dictionaries({key: values_for(fields[key].annotation) for key in keys})
        )
    return ANYTHING


FIELDS: dict[str, Any] = {
    f"{section}.{key}": field.annotation
    for section, section_field in Settings.model_fields.items()
    if isinstance(section_field.annotation, type) and issubclass(section_field.annotation, BaseModel)
    for key, field in section_field.annotation.model_fields.items()
}


NUMERIC_FIELDS = sorted(key for key, annotation in FIELDS.items() if "int" in str(annotation) or "float" in str(annotation))


@st.composite
def flag_layers(draw: st.DrawFn) -> dict[str, Any]:
    """A few settings at once (numbers more often), each a value of its type or of another."""
    keys = draw(
        st.lists(st.sampled_from(NUMERIC_FIELDS) | st.sampled_from(sorted(FIELDS)), min_size=1, max_size=4, unique=True)
    )
    return {
        key: draw(st.one_of(values_for(FIELDS[key]), ANYTHING) if draw(st.integers(0, 4)) == 0 else values_for(FIELDS[key]))
        for key in keys
    }


def _finite_everywhere(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_everywhere(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite_everywhere(v) for v in value)
    return True


@BOUNDED
@given(flags=flag_layers())
def test_any_values_through_load_config_give_settings_or_one_line(flags: dict[str, Any], tmp_path_factory: Any) -> None:
    cwd = tmp_path_factory.getbasetemp()
    try:
        resolved = load_config(cwd, {}, flags)
    except ConfigError as error:
        assert "\n" not in error.one_line()
        return
    assert _finite_everywhere(resolved.settings.model_dump(mode="python"))
    use_downstream(resolved.settings)


def use_plan(plan: PlanSettings) -> None:
    """The capacity plan's arithmetic with these inputs."""
    measured = MeasuredLimit("Q4_K_M", users=3, rps=0.37, output_tok_s=41.0, source="test")
    for target, kind in ((plan.target_rps, "requests/s"), (plan.target_users, "users")):
        if target is not None:
            count = servers_for(float(target), 0.37 if kind == "requests/s" else 3.0, plan.headroom_frac, kind)
            if plan.price_per_hour is not None:
                costs(plan.price_per_hour, measured, count)
    if plan.memory_budget_gib is not None:
        int(plan.memory_budget_gib * 2**30)


def use_downstream(settings: Settings) -> None:
    """What the settings feed, run with them: the capacity plan's arithmetic, the limit search,
    the length distributions' draws, the worker choice (where inf used to end in OverflowError)."""
    use_plan(settings.plan)
    limit = settings.limit
    for kind, start, most in (("users", limit.start_users, limit.max_users),
                              ("rate_rps", limit.start_rate_rps, limit.max_rate_rps)):  # fmt: skip
        search = LimitSearch(kind, start, most, limit.growth, limit.rate_resolution, limit.time_cap_s)
        for _ in range(6):
            level = search.next_level()
            if level is None:
                break
            search.record(Trial(level, "meets" if level < most / 2 else "misses", seconds=limit.trial_seconds))
        search.result().sentence()
    for text in (settings.workload.input_lengths, settings.workload.output_lengths,
                 settings.sessions.turn_tokens, settings.sessions.reply_tokens):  # fmt: skip
        parse_length_distribution(text).sample(3, settings.load.seed)
    choose_workers(settings.load.workers, max(settings.load.users), usable_cores())


def toml_value(value: Any) -> str | None:
    """`value` written as TOML (None: TOML has no null, so the key is left out)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(mark in text for mark in ".en") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(t for item in value if (t := toml_value(item)) is not None) + "]"
    if isinstance(value, dict):
        pairs = [f"{key} = {t}" for key, item in value.items() if (t := toml_value(item)) is not None]
        return "{ " + ", ".join(pairs) + " }"
    return json.dumps(str(value))


@st.composite
def tenant_tables(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One to three [[tenants]] tables: a name and a load of any number (users or a rate), often with
    random other keys of any value (which may break the table on purpose)."""
    tables = []
    for index in range(draw(st.integers(1, 3))):
        table = {"name": f"t{index}", draw(st.sampled_from(["users", "rate_rps"])): draw(NUMBERS)}
        if draw(st.booleans()):
            table.update(draw(values_for(TenantSettings)))
        tables.append(table)
    return tables


@BOUNDED
@given(tenants=tenant_tables(), steps=st.one_of(st.none(), values_for(tuple[float, ...])))
def test_any_tenant_tables_give_settings_or_one_line(
    tenants: list[dict[str, Any]], steps: Any, tmp_path_factory: Any
) -> None:
    folder = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    lines = []
    for table in tenants:
        lines.append("[[tenants]]")
        lines += [f"{key} = {text}" for key, value in table.items() if (text := toml_value(value)) is not None]
    if steps is not None:
        lines += ["[noisy_neighbour]", f"steps = {toml_value(steps)}"]
    (folder / "quantload.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        resolved = load_config(folder, {}, {})
    except ConfigError as error:
        assert "\n" not in error.one_line()
        return
    settings = resolved.settings
    assert _finite_everywhere(settings.model_dump(mode="python"))
    neighbour = settings.neighbour_tenant
    for tenant in settings.tenants:  # what a noisy-neighbour stage sums, at its largest step
        step = max(settings.noisy_neighbour.steps) if tenant is neighbour else 0.0
        users = (tenant.rate_users if tenant.open_loop else (tenant.users or 0)) + step
        assert users <= 2 * MAX_USERS or tenant.open_loop
        slo = tenant_slo(tenant, Slo(settings.slo.ttft_s, settings.slo.tpot_s))
        assert math.isfinite(slo.ttft_s) and math.isfinite(slo.tpot_s)


@pytest.mark.parametrize("key", sorted(k for k, a in FIELDS.items() if "float" in str(a)))
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308])
def test_every_float_setting_refuses_what_is_not_a_finite_number_in_range(key: str, value: float, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {}, {key: value})
    assert key in caught.value.one_line()


# ------------------------------------------------------------------ through the command line

FLOAT_TEXT = st.one_of(st.sampled_from(["inf", "-inf", "nan", "1e308", "5e-324", "0", "-1"]), st.floats().map(str))
INT_TEXT = st.one_of(st.sampled_from(["0", "-1", str(2**63), str(10**30)]), st.integers(-(2**66), 2**66).map(str))
LOAD_FLAGS: dict[str, st.SearchStrategy[str]] = {
    "--speed": FLOAT_TEXT,
    "--turns": INT_TEXT,
    "--sessions": INT_TEXT,
    "--think-time": FLOAT_TEXT,
    "--time-cap": FLOAT_TEXT,
    "--max-users": INT_TEXT,
    "--users": st.lists(st.one_of(st.integers(-5, 2**66), st.floats()), min_size=1, max_size=3).map(
        lambda values: ",".join(map(str, values))
    ),
    "--repeats": INT_TEXT,
    "--rates": st.lists(st.floats(), min_size=1, max_size=3).map(lambda values: ",".join(map(str, values))),
    "--prompt-count": INT_TEXT,
    "--max-tokens": INT_TEXT,
    "--metrics-port": st.integers(-(2**20), 2**20).map(str),
    "--request-timeout": FLOAT_TEXT,
    "--first-byte-timeout": FLOAT_TEXT,
    "--input-lengths": st.sampled_from(
        ["normal:mean=inf,sd=1", "fixed:100000000", "lognormal:mean=5,spread=1e308", "uniform:1-1e300", "fixed:64"]
    ),
    "--batch-sizes": st.sampled_from(["0/0", "2048/512", "1/2", "99999999999/1", "a/b"]),
    "--duration": st.one_of(
        FLOAT_TEXT, st.sampled_from(["1h", "20m", "90s", "inf h", "nan m", "1e308h", "-5m", "2d", "an hour", ""])
    ),
}
REPORT_FLAGS: dict[str, st.SearchStrategy[str]] = {
    name: st.one_of(FLOAT_TEXT, INT_TEXT, st.sampled_from(["inf", "nan"]))
    for name in (
        "--slo-ttft-p99", "--slo-tpot", "--max-kld", "--target-rps", "--headroom", "--price-per-hour",
        "--memory-budget-gib",
    )
}
REPORT_FLAGS["--target-users"] = INT_TEXT


class Reached(QuantloadError):
    """The command got past its configuration: where the stand-in stops it."""


def _stop(*args: Any, **kwargs: Any) -> Any:
    """Stands in for the work: what reaches it must be finite and usable."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, BaseModel):
            assert _finite_everywhere(value.model_dump(mode="python")), value
        if isinstance(value, Settings):
            use_downstream(value)
        if isinstance(value, PlanSettings):
            use_plan(value)
    raise Reached("reached the work")


@st.composite
def flag_lines(draw: st.DrawFn, flags: dict[str, st.SearchStrategy[str]]) -> list[str]:
    chosen = draw(st.lists(st.sampled_from(sorted(flags)), min_size=1, max_size=3, unique=True))
    return [part for name in chosen for part in (name, draw(flags[name]))]


@BOUNDED
@given(argv=flag_lines(LOAD_FLAGS))
def test_load_flags_of_any_value_are_settings_or_one_line(
    argv: list[str], tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run_steps, "run_experiment", _stop)
    out = tmp_path_factory.getbasetemp() / "load-out"
    code = main(["load", "--url", "http://127.0.0.1:9", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    # refused in one line (2), or the work reached: a failed experiment is said and the load goes
    # on, exit 1 (quantload.stack.run_driver)
    assert code == (1 if "reached the work" in errors[0] else 2), err


@BOUNDED
@given(argv=flag_lines(REPORT_FLAGS))
def test_report_flags_of_any_value_are_settings_or_one_line(
    argv: list[str], tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cmd_report, "build_report", _stop)
    code = main(["report", str(tmp_path_factory.getbasetemp()), "--plan", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
