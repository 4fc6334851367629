"""Length distributions and trace files: sampling, the text forms, and every bad input."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from quantload.errors import ConfigError
from quantload.load.lengths import parse_length_distribution
from quantload.load.trace import read_trace, replay_offsets


@pytest.mark.parametrize(
    ("text", "mean", "tolerance"),
    [("fixed:128", 128, 0), ("uniform:100-400", 250, 12), ("normal:mean=500,sd=120", 500, 15),
     ("lognormal:mean=500,spread=0.8", 500, 40), ("buckets:128x0.5,512x0.3,2048x0.2", 627.2, 50)],
)
def test_samples_follow_the_named_distribution(text: str, mean: float, tolerance: float) -> None:
    distribution = parse_length_distribution(text)
    samples = distribution.sample(4000, seed=7, maximum=100_000)
    assert abs(statistics.fmean(samples) - mean) <= tolerance
    assert distribution.sample(50, seed=7) == distribution.sample(50, seed=7)
    assert parse_length_distribution(distribution.text()) == distribution
    assert distribution.expected_tokens == pytest.approx(mean)


def test_samples_stay_within_the_bounds_and_keep_a_long_tail() -> None:
    lognormal = parse_length_distribution("lognormal:mean=300,spread=1.2")
    samples = lognormal.sample(2000, seed=1, minimum=16, maximum=3000)
    assert min(samples) >= 16 and max(samples) <= 3000
    assert statistics.median(samples) < statistics.fmean(samples)  # skewed right, as real prompts are
    assert set(parse_length_distribution("buckets:64x1,4096x1").sample(200, seed=3)) == {64, 4096}


@pytest.mark.parametrize(
    ("text", "needle"),
    [("", "KIND:PARAMETERS"), ("fixed:", "KIND:PARAMETERS"), ("fixed:-3", "positive"),
     ("uniform:400-100", "below LOW"), ("uniform:5", "LOW-HIGH"), ("normal:mean=5", "mean=...,sd="),
     ("lognormal:mean=abc,spread=1", "not a number"), ("buckets:128", "TOKENSxWEIGHT"),
     ("zipf:1.2", "unknown kind")],
)
def test_a_bad_distribution_says_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as caught:
        parse_length_distribution(text)
    assert "lognormal:mean=" in caught.value.hint


def test_a_mooncake_trace_is_read_sorted_and_relative(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 5000, "input_length": 700, "output_length": 20, "hash_ids": [1, 2]}\n'
        '\n'
        '{"timestamp": 3000, "input_length": 100, "output_length": 5}\n'
        '{"timestamp": 3500, "input_length": 300, "output_length": 9}\n'
    )
    requests = read_trace(trace)
    assert [(r.arrival_s, r.input_tokens, r.output_tokens, r.line) for r in requests] == [
        (0.0, 100, 5, 3), (0.5, 300, 9, 4), (2.0, 700, 20, 1),
    ]
    assert requests[2].extra == {"hash_ids": [1, 2]}
    assert replay_offsets(requests, speed=2) == [0.0, 0.25, 1.0]


def test_other_field_names_are_accepted(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 1.5, "input_tokens": 10, "output_tokens": 4}\n'
                     '{"arrival_s": 2.0, "prompt_tokens": 12, "completion_tokens": 3}\n')
    assert [(r.arrival_s, r.input_tokens) for r in read_trace(trace)] == [(0.0, 10), (0.5, 12)]


@pytest.mark.parametrize(
    ("content", "needle"),
    [("", "holds no request"), ("not json\n", ":1 is not JSON"), ("[1, 2]\n", ":1 is not a JSON object"),
     ('{"timestamp": 1, "input_length": 5}\n', ":1 has no output length"),
     ('{"input_length": 5, "output_length": 1}\n', ":1 has no arrival time"),
     ('{"timestamp": 1, "input_length": 0, "output_length": 1}\n', "input_length 0 is not a possible length"),
     ('{"timestamp": 1, "input_length": 5, "output_length": 2.5}\n', "not a possible length"),
     ('{"timestamp": -1, "input_length": 5, "output_length": 2}\n', "negative"),
     ('{"timestamp": 1, "input_length": "5", "output_length": 2}\n', "not a number of tokens"),
     ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1}\n', ":2 has no input")],
)
def test_a_bad_trace_names_the_line(tmp_path: Path, content: str, needle: str) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        read_trace(trace)


def test_a_missing_trace_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_trace(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="positive"):
        replay_offsets([], speed=0)
