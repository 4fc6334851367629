"""Every number a setting takes has a finite upper bound, stated where the setting is declared
(config.py): a walk over every section's fields, the items of its lists and the nested tables
([[tenants]], their workload and sessions, prepare.mixes) fails on a number without one. Without
a bound, a tenant of 10^12 users or a KV budget of 4*10^12 cells reaches a plan or a llama-server
command line it breaks."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from annotated_types import Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from quantload.config import (
    MAX_TOKENS,
    MAX_USERS,
    Settings,
    load_config,
)
from quantload.errors import ConfigError


def _upper_bound(metadata: list[Any]) -> float | None:
    bounds = [item.le for item in metadata if isinstance(item, Le)]
    bounds += [item.lt for item in metadata if isinstance(item, Lt)]
    return min(bounds) if bounds else None


def _numbers(path: str, annotation: Any, metadata: list[Any]) -> Iterator[tuple[str, float | None]]:
    """(dotted path, upper bound or None) of every number `annotation` holds."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        inner = [m for arg in args[1:] for m in (arg.metadata if isinstance(arg, FieldInfo) else [arg])]
        yield from _numbers(path, args[0], [*metadata, *inner])
    elif origin in (types.UnionType, typing.Union):
        for arg in args:
            yield from _numbers(path, arg, metadata)
    elif origin in (tuple, list):
        for arg in args:
            if arg is not Ellipsis:
                yield from _numbers(f"{path}[]", arg, [])
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from _model_numbers(path, annotation)
    elif annotation in (int, float):
        yield path, _upper_bound(metadata)


def _model_numbers(prefix: str, model: type[BaseModel]) -> Iterator[tuple[str, float | None]]:
    for name, field in model.model_fields.items():
        yield from _numbers(f"{prefix}.{name}" if prefix else name, field.annotation, list(field.metadata))


NUMBERS = dict(_model_numbers("", Settings))


def test_the_walk_reaches_nested_tables_and_list_items() -> None:
    for path in ("tenants[].users", "tenants[].workload.requests", "tenants[].sessions.turns",
                 "load.users[]", "noisy_neighbour.steps[]", "calibrate.streams[]"):  # fmt: skip
        assert path in NUMBERS
    assert len(NUMBERS) > 150


@pytest.mark.parametrize("path", sorted(NUMBERS))
def test_every_number_has_a_finite_upper_bound(path: str) -> None:
    bound = NUMBERS[path]
    assert bound is not None and math.isfinite(bound), f"{path} has no upper bound: give it le= in config.py"


TOO_MANY = [
    ("batching.users", 10**12),
    ("slots.kv_cells", 4 * 10**12),
    ("tune.ctx_per_slot", 10**8),
    ("noisy_neighbour.steps", [0, 1e12]),
]


@pytest.mark.parametrize(("key", "value"), TOO_MANY)
def test_the_tours_unbounded_settings_are_refused_in_one_line(key: str, value: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {}, {key: value})
    line = caught.value.one_line()
    assert key in line and "\n" not in line


@pytest.mark.parametrize(
    "tenant",
    [
        'name = "a"\nusers = 1000000000000',
        'name = "a"\nrate_rps = 1e15',
        'name = "a"\nrate_rps = 2.0\nrate_users = 1000000000000',
        'name = "a"\nusers = 2\nweight = 1e300',
    ],
)
def test_a_tenant_beyond_its_bounds_is_refused_naming_it(tenant: str, tmp_path: Path) -> None:
    (tmp_path / "quantload.toml").write_text(f"[[tenants]]\n{tenant}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {}, {})
    assert "tenants[0] ('a')" in caught.value.one_line()


def test_the_bounds_sit_where_a_run_can_use_them() -> None:
    assert NUMBERS["tenants[].users"] == MAX_USERS
    assert NUMBERS["tune.ctx_per_slot"] == MAX_TOKENS
    assert NUMBERS["context.ctx_per_slot"] == MAX_TOKENS


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"server.slots": 4096, "server.ctx_per_slot": 10_000_000}, "server.slots x server.ctx_per_slot"),
        ({"tune.slots": [256], "tune.ctx_per_slot": 10_000_000}, "tune.slots x tune.ctx_per_slot"),
    ],
)
def test_a_server_of_more_cells_than_llama_server_takes_is_refused(
    flags: dict[str, Any], named: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="KV cells") as caught:
        load_config(tmp_path, {}, flags)
    assert named in caught.value.one_line()


def test_a_closed_loop_neighbour_steps_within_the_users_bound(tmp_path: Path) -> None:
    (tmp_path / "quantload.toml").write_text(
        '[[tenants]]\nname = "a"\nusers = 2\n[noisy_neighbour]\nsteps = [0, 1e6]\n', encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="more than 100,000"):
        load_config(tmp_path, {}, {})
