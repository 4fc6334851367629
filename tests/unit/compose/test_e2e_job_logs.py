"""The compose e2e keeps every one-shot job's whole output: which job a `run` is, and a second run
of the same job kept beside the first (the e2e itself needs a Docker Engine; this is its bookkeeping)."""

from __future__ import annotations

from pathlib import Path

from e2e.compose_e2e.project import Compose, job_label


def test_a_run_command_is_labelled_by_its_service_and_command() -> None:
    assert job_label(["run", "--rm", "-T", "--use-aliases", "load"]) == "load"
    assert job_label(["run", "--rm", "-T", "--no-deps", "-e", "QUANTLOAD_LOAD__REPEATS=1", "load"]) == "load"
    assert job_label(["run", "--rm", "-T", "report", "tar", "-C", "/results"]) == "report tar"


def test_every_output_of_a_job_is_kept(tmp_path: Path) -> None:
    compose = Compose("p", tmp_path / "env", {}, object())
    compose.keep_job_output("load", "first")
    compose.keep_job_output("load", "second")
    compose.keep_job_output("report", "the report")
    assert compose.job_outputs == {"load": "first", "load #2": "second", "report": "the report"}
