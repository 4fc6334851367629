"""Which Locust processes run a plan: the worker count for a machine, and the command lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.config import LoadSettings, load_config
from quantload.errors import ConfigError
from quantload.load.processes import (
    ENTRY_MODULE,
    LOCUST_MASTER_PORT,
    STREAMS_PER_PROCESS,
    LocustProcesses,
    choose_workers,
    master_listen_port,
    most_workers,
    usable_cores,
)


@pytest.mark.parametrize(
    ("max_users", "cores", "workers"),
    [
        (8, 2, 0),  # a few users: one process, whatever the machine
        (256, 64, 0),  # one process measures 256 streams
        (257, 2, 0),  # more, but two cores leave no room for a master and two workers
        (257, 3, 2),  # just room: two workers, a core each, the master on the third
        (600, 16, 3),  # as many workers as 256-stream shares
        (5000, 4, 3),  # never more workers than cores minus the master's
    ],
)
def test_auto_picks_one_process_unless_workers_pay_off(max_users: int, cores: int, workers: int) -> None:
    choice = choose_workers("auto", max_users, cores)
    assert choice.workers == workers
    spread_wanted_but_no_room = max_users > 256 and workers == 0
    assert (choice.warning is not None) == spread_wanted_but_no_room
    assert choice.reason


def test_auto_spreads_over_the_streams_this_machines_calibration_proved() -> None:
    assert choose_workers("auto", 300, 8, per_process=512).workers == 0  # a fast machine: one process
    assert choose_workers("auto", 200, 8, per_process=64).workers == 4  # a slow one: 200 / 64 -> 4
    crowded = choose_workers("auto", 200, 2, per_process=64)
    assert crowded.workers == 0 and crowded.warning is not None
    assert "more than the 64 one load process measures right here" in crowded.warning
    assert choose_workers("auto", 10, 2, per_process=0).workers == 0  # nothing proved: still runs


def test_a_number_is_used_as_asked_with_a_warning_when_the_cores_cannot_run_it() -> None:
    fits = choose_workers(1, 8, cores=2)
    assert (fits.workers, fits.warning) == (1, None)
    crowded = choose_workers(2, 8, cores=2)
    assert crowded.workers == 2
    assert crowded.warning is not None and "2 core(s)" in crowded.warning and "auto" in crowded.warning
    assert choose_workers(0, 1000, cores=1).warning is None
    with pytest.raises(ValueError, match="0 or more"):
        choose_workers(-1, 8, cores=2)


def test_workers_default_to_auto_and_read_numbers_and_auto_from_every_layer(tmp_path: Path) -> None:
    assert LoadSettings().workers == "auto"
    assert load_config(tmp_path, {"QUANTLOAD_LOAD__WORKERS": "3"}).settings.load.workers == 3
    assert load_config(tmp_path, {"QUANTLOAD_LOAD__WORKERS": "auto"}).settings.load.workers == "auto"
    assert load_config(tmp_path, {}, {"load.workers": "2"}).settings.load.workers == 2
    with pytest.raises(ConfigError, match=r"load\.workers"):
        load_config(tmp_path, {"QUANTLOAD_LOAD__WORKERS": "many"})


def test_usable_cores_is_at_least_one() -> None:
    assert usable_cores() >= 1
    assert STREAMS_PER_PROCESS == 256


def test_one_process_or_a_master_and_workers(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    (local,) = LocustProcesses(0, "127.0.0.1", 9647, python="py").processes(plan, tmp_path, "inv")
    assert local.role == "local" and local.log_name == "locust-inv-local.log"
    assert local.argv[:3] == ("py", "-m", ENTRY_MODULE)
    assert "--plan" in local.argv and str(plan) in local.argv and "9647" in local.argv

    master, *workers = LocustProcesses(2, "127.0.0.1", 9647, python="py").processes(plan, tmp_path, "inv")
    assert master.role == "master" and [w.role for w in workers] == ["worker", "worker"]
    assert master.argv[master.argv.index("--expect-workers") + 1] == "2"
    port = master.argv[master.argv.index("--master-port") + 1]
    for index, worker in enumerate(workers):
        assert worker.argv[worker.argv.index("--master-port") + 1] == port
        assert worker.argv[worker.argv.index("--metrics-port") + 1] == str(9647 + 1 + index)
        assert worker.log_name == f"locust-inv-worker{index}.log"
        assert "--plan" not in worker.argv  # tickets carry everything a worker needs
    unserved = LocustProcesses(1, "127.0.0.1", 0).processes(plan, tmp_path, "inv")
    assert unserved[1].argv[unserved[1].argv.index("--metrics-port") + 1] == "0"


def test_most_workers_covers_every_experiment_of_the_settings() -> None:
    small = LoadSettings(users=(1, 2, 4, 8))
    assert most_workers(small, cores=16) == 0
    crowded = LoadSettings(users=(8,), open_loop_users=600)
    assert most_workers(crowded, cores=16) == 3  # the open-loop user pool decides
    assert most_workers(LoadSettings(workers=2), cores=2) == 2  # as asked
    # a calibration that proved 64 streams a process: 600 users take more workers, as the layout will
    assert most_workers(crowded, cores=16, per_process=64) == 10


def test_workers_on_other_hosts_wait_at_a_known_address(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    layout = LocustProcesses(0, "10.0.0.5", 9647, python="py", remote_workers=2, master_host="10.0.0.5")
    (master,) = layout.processes(plan, tmp_path, "inv")  # no worker of its own: they join from elsewhere
    assert master.role == "master" and master.metrics_host == "10.0.0.5"
    assert master.argv[master.argv.index("--master-host") + 1] == "10.0.0.5"
    assert master.argv[master.argv.index("--master-port") + 1] == str(LOCUST_MASTER_PORT) == "5557"
    assert master.argv[master.argv.index("--expect-workers") + 1] == "2"
    mixed = LocustProcesses(1, "0.0.0.0", 9647, remote_workers=3, master_host="0.0.0.0", master_port=6000)
    master, own = mixed.processes(plan, tmp_path, "inv")
    assert master.argv[master.argv.index("--expect-workers") + 1] == "4"  # its own and the others
    assert own.argv[own.argv.index("--master-host") + 1] == "127.0.0.1"  # reaches 0.0.0.0 on loopback
    assert own.argv[own.argv.index("--master-port") + 1] == "6000"


def test_the_master_port_is_as_set_else_5557_for_other_hosts_else_a_free_one() -> None:
    assert master_listen_port("10.0.0.5", 7000, 2) == 7000
    assert master_listen_port("10.0.0.5", 0, 2) == LOCUST_MASTER_PORT
    free = master_listen_port("127.0.0.1", 0, 0)
    assert free != LOCUST_MASTER_PORT and 0 < free < 65536
    assert 0 < master_listen_port("0.0.0.0", 0, 0) < 65536


def test_remote_worker_settings_come_from_every_layer(tmp_path: Path) -> None:
    loaded = load_config(
        tmp_path,
        {"QUANTLOAD_LOAD__REMOTE_WORKERS": "2", "QUANTLOAD_LOAD__MASTER_HOST": "10.0.0.5"},
        {"load.master_port": 6001},
    ).settings.load
    assert (loaded.remote_workers, loaded.master_host, loaded.master_port) == (2, "10.0.0.5", 6001)
    with pytest.raises(ConfigError, match=r"load\.master_port"):
        load_config(tmp_path, {"QUANTLOAD_LOAD__MASTER_PORT": "70000"})


def test_the_master_is_told_how_long_to_wait_for_its_workers(tmp_path: Path) -> None:
    layout = LocustProcesses(
        0, "10.0.0.5", 0, remote_workers=1, master_host="10.0.0.5", workers_timeout_s=7.5
    )
    (master,) = layout.processes(tmp_path / "plan.json", tmp_path, "inv")
    assert master.argv[master.argv.index("--workers-timeout") + 1] == "7.5"
    (local,) = LocustProcesses(0, "127.0.0.1", 0).processes(tmp_path / "plan.json", tmp_path, "inv")
    assert "--workers-timeout" not in local.argv  # one process waits for nobody
