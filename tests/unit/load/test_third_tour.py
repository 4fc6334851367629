"""The third bad-input tour's cases around the load, each with its clear line before any work: a
soak too short to send anything, the context experiment's shift alone against a foreign server,
the master's address, an HTTP client's advice kept out of errors, labels shown as they are on the
console, what only writing finds, and the settings a load ran with kept for its report."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from quantload.analysis.run_data import load_run
from quantload.cli.main import main
from quantload.config import load_config
from quantload.errors import ConfigError, QuantloadError
from quantload.load.calibrate import RemoteFake
from quantload.load.fakeserver import FakeScript
from quantload.stack import run_steps

NOBODY = "http://127.0.0.1:9"


class Reached(QuantloadError):
    """The command got past its checks: where the stand-in stops it."""


def _reached(*args: Any, **kwargs: Any) -> Any:
    raise Reached("reached the load")


def _one_error(err: str) -> str:
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    return line


def test_a_soak_too_short_to_send_anything_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="too short to send anything"):
        load_config(tmp_path, {}, {"soak.duration_s": 1e-320})
    code = main(["load", "--url", NOBODY, "--out", str(tmp_path / "o"), "-e", "soak", "--duration", "1e-320"])
    assert code == 2 and "soak.duration_s" in _one_error(capsys.readouterr().err)
    assert not (tmp_path / "o" / "records.jsonl").exists()


def test_shift_alone_against_a_server_quantload_did_not_start_is_refused_before_any_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "quantload.toml").write_text('[context]\npolicies = ["shift"]\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_steps, "run_experiment", _reached)
    out = tmp_path / "o"
    assert main(["load", "--url", NOBODY, "--out", str(out), "-e", "context"]) == 2
    line = _one_error(capsys.readouterr().err)
    assert "only shift" in line and "add fail or trim" in line
    assert not (out / "records.jsonl").exists()


def test_the_masters_address_is_read_only_where_workers_join_and_must_be_one_to_listen_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run_steps, "run_experiment", _reached)
    out = str(tmp_path / "o")
    main(["load", "--url", NOBODY, "--out", out, "--master-host", "10.0.0.5", "--workers", "0"])
    assert "--master-host is read only when workers join a master" in capsys.readouterr().err
    assert main(["load", "--url", NOBODY, "--out", out, "--remote-workers", "1", "--master-host", "not an address"]) == 2
    assert "'not an address' is not a host name or IP address" in _one_error(capsys.readouterr().err)
    assert main(["load", "--url", NOBODY, "--out", out, "--remote-workers", "1", "--master-host", "192.0.2.1"]) == 2
    assert "the Locust master cannot listen on 192.0.2.1" in _one_error(capsys.readouterr().err)
    assert main(["load-worker", "--master-host", "bad host!"]) == 2
    assert "--master-host" in _one_error(capsys.readouterr().err)


@pytest.fixture
def answers_404() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_calibrate_says_the_status_without_the_http_librarys_help_link(answers_404: str) -> None:
    with pytest.raises(QuantloadError) as caught:
        RemoteFake(answers_404, FakeScript()).check()
    line = caught.value.one_line()
    assert "HTTP 404 Not Found" in line and "\n" not in line
    assert "For more information" not in line and "developer.mozilla.org" not in line


def test_labels_are_shown_as_they_are_never_read_as_console_markup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("QUANTLOAD_MODEL__SOURCE", "[b]q[/b][red]")
    assert main(["config", "show"]) == 0
    assert "[b]q[/b][red]" in capsys.readouterr().out


def test_what_only_writing_finds_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def disk_full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "o" / "stages.jsonl"))

    monkeypatch.setattr(run_steps, "run_experiment", disk_full)
    assert main(["load", "--url", NOBODY, "--out", str(tmp_path / "o")]) == 1
    line = _one_error(capsys.readouterr().err)
    assert "cannot write" in line and "stages.jsonl" in line and "No space left on device" in line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_out_the_kernel_refuses_is_one_line_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run_steps, "run_experiment", _reached)
    assert main(["load", "--url", NOBODY, "--out", "/proc/quantload-out"]) == 2  # root's os.access says yes
    assert "--out /proc/quantload-out cannot be written" in _one_error(capsys.readouterr().err)


def test_a_load_keeps_the_settings_it_ran_with_for_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "quantload.toml").write_text(
        '[[tenants]]\nname = "a"\nusers = 2\n[[tenants]]\nname = "b"\nusers = 1\n', encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_steps, "run_experiment", _reached)
    out = tmp_path / "o"
    main(["load", "--url", NOBODY, "--out", str(out), "-e", "noisy_neighbour"])
    settings = load_run(out).settings
    assert settings is not None and settings.neighbour_tenant is not None
    assert settings.neighbour_tenant.name == "b"  # the noisy neighbour's section has what it needs
