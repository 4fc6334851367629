"""Whether a draft model can speculate for a target: their vocabularies compared as llama.cpp does.

llama.cpp's `common_speculative_are_compatible` (common/speculative.cpp) wants the same vocabulary
type, the same add-BOS and add-EOS flags (and the same BOS / EOS ids where they are added),
vocabulary sizes within 128 tokens of each other, and the same text for every token from id 5 on.
A draft that fails is not refused: the server logs "failed to initialize speculative decoding
context" and serves without speculating. Comparing the GGUF metadata first turns that into one
line before any server starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.errors import QuantloadError
from quantload.models.gguf_scan import scan_gguf

MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_FROM_TOKEN_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID
TOKENS_KEY = "tokenizer.ggml.tokens"
VOCAB_KEYS = frozenset(
    {
        TOKENS_KEY,
        "tokenizer.ggml.model",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
    }
)


@dataclass(frozen=True)
class Vocab:
    """The parts of a GGUF vocabulary llama.cpp compares."""

    path: Path
    model: str | None
    add_bos: Any
    add_eos: Any
    bos_id: Any
    eos_id: Any
    tokens: tuple[str, ...]
    name: str


def read_vocab(path: Path) -> Vocab:
    """The vocabulary of a GGUF file; ModelError when it is not one."""
    metadata = scan_gguf(path, VOCAB_KEYS).metadata
    tokens = metadata.get(TOKENS_KEY)
    return Vocab(
        path=path,
        model=metadata.get("tokenizer.ggml.model"),
        add_bos=metadata.get("tokenizer.ggml.add_bos_token"),
        add_eos=metadata.get("tokenizer.ggml.add_eos_token"),
        bos_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_id=metadata.get("tokenizer.ggml.eos_token_id"),
        tokens=tuple(tokens) if isinstance(tokens, list) else (),
        name=str(metadata.get("general.name", path.stem)),
    )


def vocab_mismatch(target: Vocab, draft: Vocab) -> str | None:
    """Why `draft` cannot draft for `target` (llama.cpp's rule, see the module docstring); None
    when it can."""
    if not target.tokens or not draft.tokens:
        missing = target if not target.tokens else draft
        return f"{missing.path.name} has no vocabulary ({TOKENS_KEY})"
    if target.model != draft.model:
        return f"vocabulary type {draft.model!r} differs from the target's {target.model!r}"
    for what, mine, theirs, added in (
        ("BOS", draft.bos_id, target.bos_id, target.add_bos),
        ("EOS", draft.eos_id, target.eos_id, target.add_eos),
    ):
        draft_added = draft.add_bos if what == "BOS" else draft.add_eos
        if bool(draft_added) != bool(added) or (added and mine != theirs):
            return (
                f"{what} token differs (added {draft_added}, id {mine}; the target's: added {added},"
                f" id {theirs})"
            )
    size_gap = abs(len(target.tokens) - len(draft.tokens))
    if size_gap > MAX_SIZE_DIFFERENCE:
        return (
            f"vocabulary of {len(draft.tokens):,} tokens against the target's {len(target.tokens):,}"
            f" (llama.cpp allows {MAX_SIZE_DIFFERENCE} apart)"
        )
    for token_id in range(CHECK_FROM_TOKEN_ID, min(len(target.tokens), len(draft.tokens))):
        if target.tokens[token_id] != draft.tokens[token_id]:
            return (
                f"token {token_id} is {draft.tokens[token_id]!r}, the target's is {target.tokens[token_id]!r}"
            )
    return None


def draft_file_problem(draft_path: Path) -> str | None:
    """Why `draft_path` is no draft model at all (missing, not GGUF, no vocabulary); None when it
    could be one."""
    if not draft_path.is_file():
        return f"the draft model {draft_path} does not exist"
    try:
        draft = read_vocab(draft_path)
    except QuantloadError as error:
        return f"the draft model {draft_path.name} cannot be read: {error.problem}"
    return None if draft.tokens else f"the draft model {draft_path.name} has no vocabulary ({TOKENS_KEY})"


def draft_problem(target_path: Path, draft_path: Path) -> str | None:
    """Why the draft file cannot speculate for the target file, in one phrase; None when it can."""
    problem = draft_file_problem(draft_path)
    if problem is not None:
        return problem
    draft = read_vocab(draft_path)
    why = vocab_mismatch(read_vocab(target_path), draft)
    if why is None:
        return None
    return f"the draft model {draft_path.name} ({draft.name}) is of another vocabulary: {why}"
