"""The tune's flag space: its configurations, their flags, and every bad input refused in one line
before any server starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.config import load_config
from quantload.errors import ConfigError
from quantload.llamacpp.server import ServerSpec
from quantload.llamacpp.server_help import ServerBuild, parse_server_help
from quantload.stack.server_variants import variant_spec
from quantload.tune.outcome import compose_override, env_lines, flag_environment, winner_command
from quantload.tune.space import check_space, configurations, space_key

BUILD = ServerBuild(
    frozenset({"-np", "--parallel", "-nocb"}),
    ("f32", "f16", "q8_0", "q4_0"),
    ("none", "draft-simple", "ngram-mod"),
)
HELP = """\
-t,    --threads N                      number of CPU threads to use during generation (default: -1)
-b,    --batch-size N                   logical maximum batch size (default: 2048)
-ctk,  --cache-type-k TYPE              KV cache data type for K
                                        allowed values: f32, f16, bf16, q8_0
                                        (default: f16)
-np,   --parallel N                     number of server slots (default: -1)
-cb,   --cont-batching, -nocb, --no-cont-batching
                                        whether to enable continuous batching
--spec-type none,draft-simple,ngram-mod
                                        comma-separated list of types of speculative decoding
"""


def settings(tmp_path: Path, **flags: object):  # type: ignore[no-untyped-def]
    return load_config(tmp_path, {}, flags).settings


def test_the_help_text_says_the_flags_and_types_the_build_accepts() -> None:
    build = parse_server_help(HELP)
    assert {
        "-t",
        "--threads",
        "-b",
        "-ctk",
        "-np",
        "--parallel",
        "-cb",
        "-nocb",
        "--no-cont-batching",
    } <= build.flags
    assert build.cache_types == ("f32", "f16", "bf16", "q8_0")
    assert build.spec_types == ("none", "draft-simple", "ngram-mod")


def test_the_default_space_is_small_and_every_configuration_has_its_own_key(tmp_path: Path) -> None:
    found = configurations(settings(tmp_path))
    assert len(found) == 8 and len({c.key for c in found}) == 8
    first = found[0]
    assert first.key == "np4 b2048/512 kv-f16 fa-auto t0 cb spec-none"
    assert first.args(settings(tmp_path)) == (
        "-b",
        "2048",
        "-ub",
        "512",
        "-fa",
        "auto",
        "-cb",
        "--spec-type",
        "none",
    )


def test_a_quantized_v_cache_with_flash_attention_off_is_left_out(tmp_path: Path) -> None:
    chosen = settings(
        tmp_path,
        **{
            "tune.cache_types": ["f16", "q8_0"],
            "tune.flash_attn": ["on", "off"],
            "tune.slots": [4],
            "tune.batch_sizes": ["512/512"],
        },
    )
    assert [(c.cache_type, c.flash_attn) for c in configurations(chosen)] == [
        ("f16", "on"),
        ("f16", "off"),
        ("q8_0", "on"),
    ]
    only_off = settings(tmp_path, **{"tune.cache_types": ["q8_0"], "tune.flash_attn": ["off"]})
    with pytest.raises(ConfigError, match="flash attention off"):
        check_space(only_off, BUILD)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"tune.slots": [0, 4]}, "tune.slots"),
        ({"tune.batch_sizes": ["256/512"]}, "-ub must be at most -b"),
        ({"tune.batch_sizes": ["big"]}, "is not B/UB"),
        ({"tune.cache_types": ["q9_9"]}, "tune.cache_types"),
        ({"tune.slots": [4, 4]}, "more than once"),
        ({"tune.flash_attn": ["maybe"]}, "tune.flash_attn"),
        ({"tune.bogus": [1]}, "unknown configuration key 'tune.bogus'"),
        ({"tune.eta": 1}, "tune.eta"),
    ],
)
def test_an_impossible_space_is_one_line_naming_the_key(
    tmp_path: Path, flags: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        settings(tmp_path, **flags)
    assert says in caught.value.one_line() and "\n" not in caught.value.one_line()


def test_the_build_the_draft_and_the_budget_are_checked_before_any_server(tmp_path: Path) -> None:
    lacking = settings(tmp_path, **{"tune.cache_types": ["iq4_nl"]})
    with pytest.raises(ConfigError, match="iq4_nl, a KV-cache type this llama-server build lacks"):
        check_space(lacking, BUILD)
    with pytest.raises(ConfigError, match=r"tune\.speculation names draft but no draft model"):
        check_space(settings(tmp_path, **{"tune.speculation": ["none", "draft"]}), BUILD)
    missing = settings(
        tmp_path, **{"tune.speculation": ["draft"], "speculation.draft_model": str(tmp_path / "no.gguf")}
    )
    with pytest.raises(ConfigError, match="does not exist"):
        check_space(missing, BUILD)
    no_ngram = ServerBuild(BUILD.flags, BUILD.cache_types, ("none", "draft-simple"))
    with pytest.raises(ConfigError, match="no speculative decoding type ngram-mod"):
        check_space(settings(tmp_path, **{"tune.speculation": ["ngram"]}), no_ngram)
    with pytest.raises(ConfigError, match=r"tune.budget_s \(30 s\) is shorter than one trial"):
        check_space(settings(tmp_path, **{"tune.budget_s": 30, "tune.short_trial_s": 60}), BUILD)
    assert len(check_space(settings(tmp_path), BUILD)) == 8


def test_the_space_key_ignores_the_budget_but_not_the_space_or_the_slo(tmp_path: Path) -> None:
    base = space_key(settings(tmp_path))
    assert space_key(settings(tmp_path, **{"tune.budget_s": 99999})) == base
    assert space_key(settings(tmp_path, **{"tune.slots": [2]})) != base
    assert space_key(settings(tmp_path, **{"slo.ttft_s": 3.0})) != base


def test_the_winners_command_env_and_compose_lines_apply_the_same_flags(tmp_path: Path) -> None:
    chosen = settings(
        tmp_path,
        **{
            "tune.slots": [2],
            "tune.batch_sizes": ["256/128"],
            "tune.cache_types": ["q8_0"],
            "tune.batching": ["static"],
            "tune.threads": [2],
        },
    )
    (config,) = configurations(chosen)
    spec = ServerSpec(model_path=Path("m.gguf"), alias="m-Q8_0", port=8080)
    argv = winner_command(spec, config, chosen, Path("/bin/llama-server")).split()
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("-c") + 1] == str(2 * config.ctx_per_slot)
    assert argv[argv.index("-ctv") + 1] == "q8_0" and "-nocb" in argv and argv[argv.index("-t") + 1] == "2"
    assert argv[argv.index("-ub") + 1] == "128" and argv[-2:] == ["--spec-type", "none"]
    assert env_lines(config) == ["QL_SLOTS=2", f"QL_CTX_TOTAL={2 * config.ctx_per_slot}"]
    override = compose_override(config, chosen, "Q8_0")
    assert override.startswith("services:\n  llama-q8-0:\n    environment:\n")
    for line in (
        'LLAMA_ARG_BATCH: "256"',
        'LLAMA_ARG_UBATCH: "128"',
        'LLAMA_ARG_CACHE_TYPE_V: "q8_0"',
        'LLAMA_ARG_CONT_BATCHING: "0"',
        'LLAMA_ARG_THREADS: "2"',
        'LLAMA_ARG_FLASH_ATTN: "auto"',
    ):
        assert line in override
    made = variant_spec(spec, config.server_flags(chosen, "x"))
    assert flag_environment(made.extra_args)["LLAMA_ARG_FLASH_ATTN"] == "auto"
    assert made.extra_args.count("-fa") == 1  # the space's -fa, not a second one for the q8_0 cache
