"""Which prepared files `quantload tune` searches: those asked for, not the reference made for KLD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantload.config import load_config
from quantload.tune.tune_run import tuned_quants


class Prepared:
    """The part of PreparedModels the choice reads: the manifest's labels, largest first."""

    def __init__(self, *labels: str) -> None:
        self.labels = list(labels)

    def quants(self) -> list[str]:
        return self.labels


def _settings(tmp_path: Path, **flags: Any) -> Any:
    return load_config(tmp_path, {}, {"model.source": "tiny", **flags}).settings


def test_the_tune_searches_the_files_asked_for_in_the_manifest_s_order(tmp_path: Path) -> None:
    made = Prepared("F16", "Q8_0", "Q4_K_M")  # F16 is made for KLD whatever was asked
    assert tuned_quants(_settings(tmp_path, **{"prepare.quants": ["Q4_K_M", "Q8_0"]}), made) == [
        "Q8_0",
        "Q4_K_M",
    ]
    assert tuned_quants(_settings(tmp_path, **{"model.quants": ["q8_0"]}), made) == ["Q8_0"]  # the old key
    assert tuned_quants(_settings(tmp_path), made) == ["F16", "Q8_0", "Q4_K_M"]  # the default names F16


def test_a_mix_is_tuned_by_its_name_and_given_files_all(tmp_path: Path) -> None:
    mix = {"name": "Q4_K_M-attn8", "base": "Q4_K_M", "tensor_types": ["attn_v=q8_0"]}
    made = Prepared("F16", "Q4_K_M-attn8")
    settings = _settings(tmp_path, **{"prepare.quants": ["F16"], "prepare.mixes": [mix]})
    assert tuned_quants(settings, made) == ["F16", "Q4_K_M-attn8"]
    given = Prepared("mine-Q5", "mine-Q3")
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    assert tuned_quants(_settings(tmp_path, **{"prepare.files": [str(gguf)]}), given) == [
        "mine-Q5",
        "mine-Q3",
    ]
