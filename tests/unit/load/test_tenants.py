"""Tenants sharing a server: [[tenants]] and its one-line errors, each tenant's own concurrency in the
ticket book, the noisy-neighbour plan, and the fairness index.

The experiment against a fake server with real Locust processes, and its report:
tests/integration/load/test_tenants_processes.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from load_api import settings_context
from quantload.config import Settings, load_config
from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.base import ExperimentContext
from quantload.experiments.noisy_neighbour import stages as noisy_stages
from quantload.experiments.noisy_neighbour.tables import fairness, jain_index
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.in_locust.messages import TicketWant
from quantload.load.plan import LoadPlan, PlannedRequest, RequestParams, StagePlan
from quantload.load.records import TenantLoad
from quantload.load.tickets import Ticket, TicketBook, stage_tickets
from quantload.served import ServedTarget

TARGET = ServedTarget(name="fake", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")
LOAD = {"warmup_requests": 1, "request_timeout_s": 10, "first_round_jitter_s": 0.0, "metrics_port": 0,
        "max_tokens": 6}  # fmt: skip


def _write(tmp_path: Path, text: str) -> Settings:
    (tmp_path / "quantload.toml").write_text(text)
    return load_config(tmp_path, {}).settings


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[tenants]]\nname = "a"\nusers = 1\n[[tenants]]\nname = "a"\nusers = 2\n',
         "configuration: [[tenants]] names a more than once; give each tenant its own name"),
        ('[[tenants]]\nname = ""\nusers = 1\n', "'tenants[0].name' (from file:quantload.toml): a tenant needs a name"),
        ('[[tenants]]\nname = "a"\nusers = 1\nweight = 0\n',
         "'tenants[0] ('a').weight' (from file:quantload.toml): Input should be greater than 0"),
        ('[[tenants]]\nname = "b"\nrate_rps = -1\n', "'tenants[0] ('b').rate_rps'"),
        ('[[tenants]]\nname = "b"\nusers = 0\n', "'tenants[0] ('b').users'"),
        ('[[tenants]]\nname = "b"\n', "tenant 'b' needs users (closed loop) or rate_rps (open loop), not neither"),
        ('[[tenants]]\nname = "b"\nusers = 1\nrate_rps = 2\n', "not both"),
        ('[[tenants]]\nname = "b"\nusers = 1\nworkload = { kind = "lengths", input_lengths = "fixed:x" }\n',
         "'tenants[0] ('b').workload.input_lengths' (from file:quantload.toml): length distribution 'fixed:x'"),
        ('[[tenants]]\nname = "b"\nusers = 1\nworkload = { kind = "chat" }\n', "'tenants[0] ('b').workload.kind'"),
        ('[[tenants]]\nname = "b"\nusers = 1\nspeed = 3\n', "unknown configuration key 'tenants[0].speed'"),
        ('[[tenants]]\nname = "a b"\nusers = 1\n', "'a b' cannot name a tenant"),
        ('[[tenants]]\nname = "a"\nusers = 1\n[noisy_neighbour]\nneighbour = "zz"\n',
         "noisy_neighbour.neighbour 'zz' is no tenant; name one of a"),
        ('[[tenants]]\nname = "a"\nusers = 1\n[noisy_neighbour]\nsteps = [0, 1.5]\n', "1.5 is not a whole number"),
        ('[noisy_neighbour]\nsteps = [4, 2]\n', "steps must rise"),
    ],
)  # fmt: skip
def test_bad_tenants_are_one_line_naming_the_tenant(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _write(tmp_path, toml)
    assert message in caught.value.one_line() and "\n" not in caught.value.one_line()


def test_tenants_come_only_from_the_file_and_show_in_config_show(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[\[tenants\]\] cannot be set from the environment"):
        load_config(tmp_path, {"QUANTLOAD_TENANTS__NAME": "a"})
    settings = _write(tmp_path, '[[tenants]]\nname = "a"\nusers = 2\n[[tenants]]\nname = "b"\nrate_rps = 0.5\n')
    assert [t.name for t in settings.tenants] == ["a", "b"] and settings.neighbour_tenant is not None
    assert settings.neighbour_tenant.name == "b" and settings.neighbour_tenant.open_loop
    from quantload.config import describe

    rows = {key: source for key, _, source in describe(load_config(tmp_path, {}))}
    assert rows["tenants[0]"] == rows["tenants[1]"] == "file:quantload.toml"
    assert Settings.model_validate(settings.model_dump(mode="json")) == settings  # config.json round trip


def _book_plan(tenants: tuple[TenantLoad, ...], requests: tuple[PlannedRequest, ...]) -> LoadPlan:
    stage = StagePlan(stage_id="i-0", index=0, experiment="noisy_neighbour", users=sum(t.users for t in tenants),
                      cache_prompt=False, requests=requests, tenants=tenants)  # fmt: skip
    return LoadPlan(run_id="r", invocation="i", target=TARGET, params=RequestParams(),
                    prompts={r.prompt_id: "x" for r in requests}, stages=(stage,))  # fmt: skip


def test_the_book_keeps_each_tenant_within_its_users() -> None:
    requests = tuple(PlannedRequest(prompt_id=f"a{k}", tenant="a") for k in range(4)) + tuple(
        PlannedRequest(prompt_id=f"b{k}", tenant="b") for k in range(4)
    )
    plan = _book_plan((TenantLoad(name="a", users=1), TenantLoad(name="b", users=2)), requests)
    got: list[tuple[str, Ticket | None]] = []
    book: TicketBook[str] = TicketBook(lambda waiter, ticket: got.append((waiter, ticket)))
    book.add(stage_tickets(plan, plan.stages[0], False))
    for user in ("u1", "u2", "u3", "u4"):
        book.want(user)
    handed = [(w, t.prompt_id) for w, t in got if t is not None]
    assert handed == [("u1", "a0"), ("u2", "b0"), ("u3", "b1")] and book.waiting == 1  # a at 1, b at 2
    lane_a = got[0][1].lane if got[0][1] else None
    assert lane_a == "i-0/m/a" and book.in_flight("i-0/m/a") == 1 and book.in_flight("i-0/m/b") == 2
    book.want("u1", done=lane_a)  # u1 finished a0: a may send again; u4 waited longer and gets it
    assert [(w, t.prompt_id if t else None) for w, t in got[3:]] == [("u4", "a1")]
    assert book.waiting == 1 and book.in_flight("i-0/m/a") == 1
    assert TicketWant.from_data(TicketWant(3, lane_a).to_data()) == TicketWant(3, lane_a)
    assert TicketWant.from_data({"want": 3}) == TicketWant(3, None)  # from a worker of an older version
    ticket = got[1][1]
    assert ticket is not None and Ticket.from_wire(ticket.to_wire()) == ticket


def test_tickets_of_no_tenant_go_first_come_first_served_as_before() -> None:
    plan = _book_plan((), tuple(PlannedRequest(prompt_id=f"p{k}") for k in range(3)))
    got: list[str] = []
    book: TicketBook[str] = TicketBook(lambda waiter, ticket: got.append(ticket.prompt_id if ticket else "-"))
    book.add(stage_tickets(plan, plan.stages[0], False))
    for user in ("u1", "u2", "u3", "u4"):
        book.want(user)
    assert got == ["p0", "p1", "p2"] and book.waiting == 1


def _two_tenants(tmp_path: Path, steps: list[float], b: dict[str, Any] | None = None) -> Settings:
    return Settings.model_validate(
        {
            "load": LOAD,
            "tenants": [
                {"name": "a", "users": 2, "slo_ttft_p99_s": 5.0},
                {"name": "b", "users": 1, **(b or {}),
                 "workload": {"kind": "lengths", "input_lengths": "fixed:40", "output_lengths": "fixed:4"}},
            ],
            "noisy_neighbour": {"steps": steps, "requests_per_user": 3},
        }
    )  # fmt: skip


def test_the_plan_has_one_stage_per_step_and_the_neighbour_only_where_it_sends(tmp_path: Path) -> None:
    settings = _two_tenants(tmp_path, [0, 1, 3])
    with FakeServer(FakeScript(tokens=4)) as fake:
        target = TARGET.model_copy(update={"url": fake.url})
        plan = noisy_stages.plan_stages(ExperimentContext(settings_context(tmp_path, settings), target), "nn-x")
    assert [(s.users, [(t.name, t.users, t.requests) for t in s.tenants], s.phase) for s in plan.stages] == [
        (2, [("a", 2, 6)], "b at 0 users"),
        (3, [("a", 2, 6), ("b", 1, 3)], "b at 1 user"),
        (5, [("a", 2, 6), ("b", 3, 9)], "b at 3 users"),
    ]  # fmt: skip
    last = plan.stages[-1]
    assert {r.tenant for r in last.requests} == {"a", "b"} and last.arrival == "closed"
    assert all(r.ignore_eos is (r.tenant == "b") for r in last.requests)  # each tenant's own workload
    assert all(r.max_tokens == 4 for r in last.requests if r.tenant == "b")
    line = plan.stage_event(last, "stage_start", 1.0)
    assert line.tenants is not None and [t.name for t in line.tenants] == ["a", "b"]


def test_an_open_loop_neighbour_sends_scheduled_arrivals_at_each_step(tmp_path: Path) -> None:
    settings = _two_tenants(tmp_path, [0, 2.5], b={"users": None, "rate_rps": 1.0, "rate_users": 3})
    settings = settings.model_copy(update={"noisy_neighbour": settings.noisy_neighbour.model_copy(
        update={"step_seconds": 4.0})})  # fmt: skip
    with FakeServer(FakeScript(tokens=4)) as fake:
        target = TARGET.model_copy(update={"url": fake.url})
        plan = noisy_stages.plan_stages(ExperimentContext(settings_context(tmp_path, settings), target), "nn-o")
    stage = plan.stages[1]
    assert stage.arrival == "poisson" and stage.rate_rps == 2.5 and stage.users == 2 + 3
    scheduled = [r.offset_s for r in stage.requests if r.offset_s is not None]
    assert len(scheduled) == 10 and scheduled == sorted(scheduled)  # 2.5 req/s for 4 s, in time order


def test_a_tenant_whose_workload_cannot_be_made_is_named_before_any_load(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {"load": LOAD, "tenants": [{"name": "a", "users": 1},
                                   {"name": "b", "users": 1, "workload": {"kind": "dataset", "dataset": "gone.json"}}]}
    )  # fmt: skip
    with FakeServer(FakeScript(tokens=4)) as fake, pytest.raises(ConfigError, match=r"^tenant 'b': .*gone.json"):
        target = TARGET.model_copy(update={"url": fake.url})
        noisy_stages.run(ExperimentContext(settings_context(tmp_path, settings), target))
    assert not (tmp_path / "records.jsonl").exists()
    assert registry.missing_input("noisy_neighbour", Settings()) == "fewer than two [[tenants]]"


def test_jain_index_and_the_shares_it_rests_on() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)  # one of two got everything: 1/n
    assert jain_index([1.0]) is None
    import pandas as pd

    frame = pd.DataFrame(
        {
            "tenant": ["a", "a", "b", "b"], "sent_unix_s": [0.0, 2.0, 0.0, 2.0], "ok": [True] * 4,
            "prompt_tokens": [10.0, 10.0, 10.0, 10.0], "prompt_n": [10.0, 10.0, 10.0, 10.0],
            "completion_tokens": [10.0, 10.0, 50.0, 50.0], "e2e_s": [1.0] * 4,
        }
    )  # fmt: skip
    index, shares = fairness(frame, {"a": (1, False), "b": (1, False)}, {"a": 1.0, "b": 1.0})
    assert shares == pytest.approx({"a": 40 / 160 / 0.5, "b": 120 / 160 / 0.5})
    assert index == pytest.approx(jain_index([0.5, 1.5]))
    even, _ = fairness(frame, {"a": (1, False), "b": (3, False)}, {"a": 1.0, "b": 1.0})
    assert even == pytest.approx(1.0)  # b kept three streams busy: its three times the service is fair
