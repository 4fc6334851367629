from __future__ import annotations

from pathlib import Path

import pytest

from quantload.cli.main import main
from quantload.config import RunSettings, Settings, describe, load_config
from quantload.errors import ConfigError


def test_defaults_are_the_full_protocol(tmp_path: Path) -> None:
    config = load_config(tmp_path, {})
    assert config.settings.run.profile == "full"
    assert config.settings.load.users == (1, 2, 4, 8)
    assert config.settings.load.repeats == 3
    assert config.settings.server.slots == 8
    assert config.settings.server.ctx_per_slot == 4096
    assert config.source_of("load.users") == "default"


def test_layers_file_then_env_then_flags(tmp_path: Path) -> None:
    (tmp_path / "quantload.toml").write_text("[load]\nmax_tokens = 64\nrepeats = 2\nusers = [1, 3]\n")
    env = {"QUANTLOAD_LOAD__MAX_TOKENS": "32", "QUANTLOAD_LLAMA_BIN": "/opt/llama"}
    config = load_config(tmp_path, env, {"load.repeats": 5, "load.seed": None})
    load = config.settings.load
    assert (load.max_tokens, load.repeats, load.users) == (32, 5, (1, 3))
    assert config.source_of("load.max_tokens") == "env:QUANTLOAD_LOAD__MAX_TOKENS"
    assert config.source_of("load.repeats") == "flag"
    assert config.source_of("load.users") == "file:quantload.toml"
    assert config.settings.toolchain.llama_bin == Path("/opt/llama")


def test_profile_presets_sit_below_user_settings(tmp_path: Path) -> None:
    config = load_config(tmp_path, {"QUANTLOAD_LOAD__MAX_TOKENS": "20"}, {"run.profile": "quick"})
    assert config.settings.load.repeats == 1
    assert config.source_of("load.repeats") == "profile:quick"
    assert config.settings.load.max_tokens == 20


@pytest.mark.parametrize(
    ("toml", "env", "flags"),
    [
        ("[run]\nprofile = 'seed'\n", {}, {}),
        ("", {"QUANTLOAD_RUN__PROFILE": "seed"}, {}),  # compose: QL_PROFILE=seed in .env
        ("", {}, {"run.profile": "seed"}),  # quantload run --profile seed
    ],
)
def test_seed_is_still_accepted_as_the_full_profile(
    tmp_path: Path, toml: str, env: dict[str, str], flags: dict[str, str]
) -> None:
    (tmp_path / "quantload.toml").write_text(toml)
    config = load_config(tmp_path, env, flags)
    assert config.settings.run.profile == "full"
    assert config.settings.load.repeats == 3 and config.settings.load.users == (1, 2, 4, 8)
    assert RunSettings.model_validate({"profile": "seed"}).profile == "full"  # an older config.json


@pytest.mark.parametrize(
    ("toml", "env", "needle"),
    [
        ("[load]\nfoo = 1\n", {}, "'load.foo'"),
        ("[nope]\nx = 1\n", {}, "'nope'"),
        ("[load]\nmax_tokens = 'many'\n", {}, "'load.max_tokens'"),
        ("", {"QUANTLOAD_SERVER__SLOTS": "-3"}, "'server.slots'"),
        ("", {"QUANTLOAD_TYPO": "1"}, "QUANTLOAD_TYPO"),
        ("[load\n", {}, "not valid TOML"),
        ("[run]\nprofile = 'huge'\n", {}, "'run.profile'"),
    ],
)
def test_bad_configuration_names_the_key(tmp_path: Path, toml: str, env: dict[str, str], needle: str) -> None:
    (tmp_path / "quantload.toml").write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, env)
    assert needle in caught.value.one_line()
    assert "\n" not in caught.value.one_line()


def test_describe_masks_secrets(tmp_path: Path) -> None:
    config = load_config(tmp_path, {"QUANTLOAD_SERVER__API_KEY": "s3cret"})
    rows = {key: (value, source) for key, value, source in describe(config)}
    assert "s3cret" not in rows["server.api_key"][0]
    assert rows["server.api_key"][1] == "env:QUANTLOAD_SERVER__API_KEY"


def test_cli_reports_config_error_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quantload.toml").write_text("[server]\nslots = 'eight'\n")
    assert main(["config", "show"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: configuration key 'server.slots'")
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err


def test_cli_config_show_lists_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTLOAD_LOAD__REPEATS", "7")
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"source": "env:QUANTLOAD_LOAD__REPEATS"' in out


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[quality]\nkld_cache_types = ['q8_0']\n", "must list f16"),
        ("[quality]\nkld_cache_types = ['f16', 'q8_0', 'q8_0']\n", "lists q8_0 more than once"),
        ("[quality]\nkld_cache_types = ['f16', 'q3_k']\n", "'q3_k'"),
        ("[quality]\nkld_chunks = -1\n", "'quality.kld_chunks'"),
    ],
)
def test_kld_settings_are_checked_in_one_line(tmp_path: Path, toml: str, needle: str) -> None:
    (tmp_path / "quantload.toml").write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {})
    line = caught.value.one_line()
    assert needle in line and "quality." in line and "\n" not in line


def test_kld_cache_types_put_f16_first_and_profiles_cap_the_chunks(tmp_path: Path) -> None:
    env = {"QUANTLOAD_QUALITY__KLD_CACHE_TYPES": "q4_0,f16"}
    assert load_config(tmp_path, env).settings.quality.kld_cache_types == ("f16", "q4_0")
    seed = load_config(tmp_path, {}).settings.quality
    assert (seed.kld, seed.kld_chunks, seed.kld_cache_types, seed.kld_keep_base) == (
        True, 40, ("f16", "q8_0"), False,
    )  # fmt: skip
    quick = load_config(tmp_path, {}, {"run.profile": "quick"}).settings.quality
    ci = load_config(tmp_path, {}, {"run.profile": "ci"}).settings.quality
    assert (quick.kld_chunks, ci.kld_chunks, ci.ctx) == (4, 2, 128)


@pytest.mark.parametrize(
    ("name", "raw", "dotted", "expected"),
    [
        ("QUANTLOAD_SERVER__API_KEY", "123456", "server.api_key", "123456"),
        ("QUANTLOAD_SERVER__API_KEY", "sk-a,b", "server.api_key", "sk-a,b"),
        ("QUANTLOAD_QUALITY__DATASET", "/data/a,b/wiki.test.raw", "quality.dataset", Path("/data/a,b/wiki.test.raw")),
        ("QUANTLOAD_OBSERVE__EXPORTER_TARGETS", "q8=http://127.0.0.1:8081,quant=Q8_0", "observe.exporter_targets",
         ("q8=http://127.0.0.1:8081,quant=Q8_0",)),
        ("QUANTLOAD_OBSERVE__EXPORTER_TARGETS", '["a=http://h:1,quant=F16", "b=http://h:2"]', "observe.exporter_targets",
         ("a=http://h:1,quant=F16", "b=http://h:2")),
        ("QUANTLOAD_LOAD__USERS", "4", "load.users", (4,)),
        ("QUANTLOAD_LOAD__USERS", "1, 2,4", "load.users", (1, 2, 4)),
        ("QUANTLOAD_LOAD__USERS", "[1, 2]", "load.users", (1, 2)),
        ("QUANTLOAD_LOAD__RATES_RPS", "0.5,1", "load.rates_rps", (0.5, 1.0)),
        ("QUANTLOAD_MODEL__QUANTS", "Q8_0,Q4_K_M", "prepare.quants", ("Q8_0", "Q4_K_M")),  # renamed
        ("QUANTLOAD_PREPARE__QUANTS", "Q6_K,IQ4_XS-imatrix", "prepare.quants", ("Q6_K", "IQ4_XS-imatrix")),
        ("QUANTLOAD_LOAD__IGNORE_EOS", "true", "load.ignore_eos", True),
        ("QUANTLOAD_OBSERVE__GRAFANA_USER", "1234", "observe.grafana_user", "1234"),
        ("QUANTLOAD_SERVER__EXTRA_ARGS", '["--flash-attn", "on"]', "server.extra_args", ("--flash-attn", "on")),
    ],
)
def test_environment_values_are_decoded_by_the_fields_type(
    tmp_path: Path, name: str, raw: str, dotted: str, expected: object
) -> None:
    settings = load_config(tmp_path, {name: raw}).settings
    section, key = dotted.split(".")
    value = getattr(getattr(settings, section), key)
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    assert value == expected


def test_a_moved_key_is_read_under_its_new_name_from_every_layer(tmp_path: Path) -> None:
    (tmp_path / "quantload.toml").write_text('[model]\nquants = ["F16", "Q6_K"]\n')
    config = load_config(tmp_path, {})
    assert config.settings.prepare.quants == ("F16", "Q6_K")
    assert config.source_of("prepare.quants") == "file:quantload.toml"
    flagged = load_config(tmp_path, {}, {"model.quants": ("Q8_0",)})
    assert flagged.settings.prepare.quants == ("Q8_0",) and flagged.source_of("prepare.quants") == "flag"
    # a run's config.json written before the move still reads
    assert Settings.model_validate({"model": {"quants": ["Q4_K_M"]}}).prepare.quants == ("Q4_K_M",)


def test_the_wide_profile_measures_seven_files_one_with_an_importance_matrix(tmp_path: Path) -> None:
    settings = load_config(tmp_path, {}, {"run.profile": "wide"}).settings
    assert settings.prepare.quants == ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS-imatrix", "Q3_K_M")
    assert settings.prepare.imatrix == "computed"
    quick = load_config(tmp_path, {}, {"run.profile": "quick"}).settings
    assert quick.prepare.quants == ("F16", "Q8_0", "Q4_K_M") and not quick.sensitivity.in_run
    assert settings.load.experiments == quick.load.experiments


def test_a_bad_environment_list_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="QUANTLOAD_LOAD__USERS"):
        load_config(tmp_path, {"QUANTLOAD_LOAD__USERS": "[1, 2"})
    with pytest.raises(ConfigError, match=r"load\.users"):
        load_config(tmp_path, {"QUANTLOAD_LOAD__USERS": "two"})


def test_an_error_about_a_secret_never_shows_it(tmp_path: Path) -> None:
    (tmp_path / "quantload.toml").write_text("[server]\napi_key = 987654\n")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {})
    message = caught.value.one_line()
    assert "server.api_key" in message and "987654" not in message and "secret" in message
