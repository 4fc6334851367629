"""Parsing and renaming llama-server's /metrics text."""

from __future__ import annotations

import math

import pytest

from fake_llama_server import metrics_text
from quantload.exporter.server_metrics import (
    RENAMES,
    ServerDataError,
    export_name,
    parse_server_metrics,
)


def _by_name(text: str) -> dict[str, float]:
    return {s.name: s.value for s in parse_server_metrics(text)}


def test_every_known_metric_is_renamed_with_its_unit() -> None:
    values = _by_name(metrics_text(prompt_tokens=7, predicted=9, processing=3, deferred=4))
    assert set(values) == {name for name, _ in RENAMES.values()}
    assert values["llamacpp_prompt_tokens_total"] == 7
    assert values["llamacpp_tokens_predicted_total"] == 9
    assert values["llamacpp_requests_processing"] == 3
    assert values["llamacpp_requests_deferred"] == 4
    assert values["llamacpp_predicted_tokens_per_second"] == 95.25
    # C++ prints large numbers with 6 significant digits
    assert values["llamacpp_sequence_tokens_max"] == 1234570.0


def test_types_follow_meaning_not_declaration() -> None:
    kinds = {s.name: s.kind for s in parse_server_metrics(metrics_text())}
    assert kinds["llamacpp_sequence_tokens_max"] == "gauge"  # declared counter, is a maximum
    assert kinds["llamacpp_decode_calls_total"] == "counter"
    assert kinds["llamacpp_prompt_tokens_per_second"] == "gauge"


def test_unknown_metrics_keep_their_type_and_labels() -> None:
    text = (
        "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\n'
        "# TYPE llamacpp:new_gauge gauge\n"
        'llamacpp:new_gauge{server="x"} 1.5\n'
        "# TYPE llamacpp:odd_counter counter\n"
        "llamacpp:odd_counter 2\n"
        "other_process_metric 5\n"
    )
    samples = {s.name: s for s in parse_server_metrics(text)}
    per_pos = samples["llamacpp_spec_decode_num_accepted_tokens_per_pos_total"]
    assert per_pos.kind == "counter" and per_pos.labels == {"position": "0"}
    # A label named like one the exporter sets is kept under another name.
    assert samples["llamacpp_new_gauge"].labels == {"exported_server": "x"}
    assert samples["llamacpp_odd_counter_total"].kind == "counter"
    assert "other_process_metric" not in samples


def test_export_name_sanitises() -> None:
    assert export_name("weird-name.x", "gauge") == ("llamacpp_weird_name_x", "gauge")


def test_nan_gauges_pass_and_nan_counters_are_dropped() -> None:
    text = "# TYPE llamacpp:a gauge\nllamacpp:a -nan\n# TYPE llamacpp:b_total counter\nllamacpp:b_total nan\n"
    samples = parse_server_metrics(text)
    assert [s.name for s in samples] == ["llamacpp_a"]
    assert math.isnan(samples[0].value)


@pytest.mark.parametrize(
    "body",
    [
        "<html><body>not metrics</body></html>",
        "llamacpp:prompt_tokens_total many",
        'llamacpp:x{a="1" b="2"} 3',
        "",
        "# only comments\n",
        "process_cpu_seconds_total 1\n",
    ],
)
def test_garbage_is_a_server_data_error(body: str) -> None:
    with pytest.raises(ServerDataError):
        parse_server_metrics(body)


def test_label_values_are_unescaped_as_the_exposition_format_says() -> None:
    text = (
        "# TYPE llamacpp:requests_processing gauge\n"
        'llamacpp:requests_processing{path="C:\\\\new",quote="say \\"hi\\"",lines="a\\nb"} 2 1700000000000\n'
    )
    (sample,) = parse_server_metrics(text)
    assert sample.labels == {"path": "C:\\new", "quote": 'say "hi"', "lines": "a\nb"}
    assert sample.value == 2.0
