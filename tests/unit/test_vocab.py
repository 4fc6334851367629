"""A draft model's vocabulary against its target's, compared as llama.cpp compares them, on GGUF
files written here with `gguf` (vocabulary only)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from quantload.config import load_config
from quantload.errors import ConfigError
from quantload.experiments.speculation.stages import check_draft
from quantload.models.vocab import draft_problem, read_vocab, vocab_mismatch

TOKENS = [f"tok{n}" for n in range(300)]


def vocab_file(
    path: Path, tokens: list[str] = TOKENS, model: str = "gpt2", bos: int = 1, add_bos: bool = False
) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_same_vocabulary_drafts_and_a_difference_below_id_5_does_not_count(tmp_path: Path) -> None:
    target = vocab_file(tmp_path / "target.gguf")
    assert draft_problem(target, vocab_file(tmp_path / "same.gguf")) is None
    early = ["other0", *TOKENS[1:]]
    assert draft_problem(target, vocab_file(tmp_path / "early.gguf", early)) is None
    assert len(read_vocab(target).tokens) == 300


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("token", "token 7 is 'changed'"),
        ("size", "vocabulary of 429 tokens against the target's 300"),
        ("model", "vocabulary type 'llama' differs"),
        ("bos", "BOS token differs"),
    ],
)
def test_another_vocabulary_is_named_with_what_differs(tmp_path: Path, kind: str, says: str) -> None:
    target = read_vocab(vocab_file(tmp_path / "target.gguf", add_bos=True))
    tokens = list(TOKENS)
    options: dict[str, object] = {"add_bos": True}
    if kind == "token":
        tokens[7] = "changed"
    elif kind == "size":
        tokens += [f"extra{n}" for n in range(129)]
    elif kind == "model":
        options["model"] = "llama"
    else:
        options["bos"] = 9
    draft = read_vocab(vocab_file(tmp_path / "draft.gguf", tokens, **options))  # type: ignore[arg-type]
    why = vocab_mismatch(target, draft)
    assert why is not None and says in why
    within = read_vocab(
        vocab_file(tmp_path / "within.gguf", [*TOKENS, *(f"x{n}" for n in range(128))], add_bos=True)
    )
    assert vocab_mismatch(target, within) is None  # 128 tokens apart is still allowed


def test_the_speculation_check_refuses_a_missing_or_foreign_draft_before_any_server(tmp_path: Path) -> None:
    target = vocab_file(tmp_path / "target.gguf")
    foreign = vocab_file(tmp_path / "foreign.gguf", [f"w{n}" for n in range(300)])
    settings = load_config(tmp_path, {}, {"speculation.draft_model": str(foreign)}).settings
    with pytest.raises(ConfigError) as caught:
        check_draft(settings, ("none", "draft-simple", "ngram-mod"), {"Q8_0": target})
    assert "foreign.gguf" in caught.value.problem and "another vocabulary: token 5" in caught.value.problem
    gone = load_config(tmp_path, {}, {"speculation.draft_model": str(tmp_path / "gone.gguf")}).settings
    with pytest.raises(ConfigError, match=r"gone\.gguf does not exist"):
        check_draft(gone, ("draft-simple", "ngram-mod"), {"Q8_0": target})
    with pytest.raises(ConfigError, match="no speculative decoding type draft-simple"):
        check_draft(settings, ("none", "ngram-mod"), {"Q8_0": target})
