"""The text an importance matrix is computed on: WikiText-2's train split (through the Hub client,
cached like the test split) or a file of the user's; never the text quality is scored on.

Checked before any work: the file exists and is not empty, it holds at least the 2 x
prepare.imatrix_ctx tokens llama-imatrix needs for one chunk (a token is at least one byte, so a
text with fewer bytes is certainly too short), and it is not the scored text (the same bytes, or a
text holding the scored text's opening, which is what llama-perplexity scores first). Where the
scored text is not on disk yet (a standalone `quantload prepare` before any quality run), the
default one, WikiText-2's test split, is known by its first sentence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from quantload.config import DEFAULT_CALIBRATION, PrepareSettings
from quantload.errors import ConfigError
from quantload.quality.dataset import (
    MIN_TEXT_BYTES,
    TRAIN_MEMBER,
    archive_url,
    cached_text_path,
    download_wikitext2,
)

OPENING_BYTES = 4096  # the scored text's opening looked for inside the calibration text
# WikiText-2's test split (the default scored text) opens with this sentence (its article 1)
WIKITEXT_TEST_OPENING = b"Robert Boulter is an English film , television and theatre actor"
SETTING = "prepare.calibration"


def _offline_hint(cache: Path, environ: Mapping[str, str]) -> str:
    return (
        f"set {SETTING} to a text file that is not the scored text, or download {archive_url(environ)}"
        f" and unzip {TRAIN_MEMBER} to {cached_text_path(cache, TRAIN_MEMBER)}"
    )


def calibration_path(prepare: PrepareSettings, cache: Path) -> Path | None:
    """The calibration file when it is already on disk (the user's, or the cached train split)."""
    if prepare.calibration != DEFAULT_CALIBRATION:
        return Path(prepare.calibration).expanduser()
    cached = cached_text_path(cache, TRAIN_MEMBER)
    return cached if cached.is_file() and cached.stat().st_size >= MIN_TEXT_BYTES else None


def check_calibration_file(path: Path, ctx_tokens: int, scored: Path | None) -> None:
    """ConfigError (one line) for a calibration file that is missing, empty, certainly too short
    for one chunk of `ctx_tokens`, or the scored text."""
    if not path.is_file():
        raise ConfigError(f"{SETTING} = {path}: no such file", f"give a text file, or {DEFAULT_CALIBRATION}")
    size = path.stat().st_size
    if size == 0:
        raise ConfigError(f"{SETTING} = {path} is empty", "give a text of some thousands of words")
    needed = 2 * ctx_tokens
    if size < needed:
        raise ConfigError(
            f"{SETTING} = {path} is too short for one chunk: {size} bytes, and llama-imatrix needs at"
            f" least {needed} tokens (2 x prepare.imatrix_ctx = {ctx_tokens})",
            "give a longer text, or lower prepare.imatrix_ctx",
        )
    known = scored is not None and scored.is_file() and _holds_scored_text(path, scored)
    if known or (scored is None and WIKITEXT_TEST_OPENING in path.read_bytes()):
        shown = scored or "WikiText-2's test split"
        raise ConfigError(
            f"{SETTING} = {path} holds the text quality is scored on ({shown}): an importance"
            " matrix calibrated on it would flatter every file made with it",
            f"calibrate on other text ({DEFAULT_CALIBRATION}, WikiText-2's train split, by default)",
        )


def _holds_scored_text(calibration: Path, scored: Path) -> bool:
    if calibration.resolve() == scored.resolve():
        return True
    data = calibration.read_bytes()
    target = scored.read_bytes()
    if hashlib.sha256(data).digest() == hashlib.sha256(target).digest():
        return True
    opening = target[:OPENING_BYTES].strip()
    return len(opening) >= 256 and opening in data


def resolve_calibration(
    prepare: PrepareSettings, cache: Path, environ: Mapping[str, str], scored: Path | None
) -> Path:
    """The calibration text, checked; WikiText-2's train split is downloaded once when needed."""
    path = calibration_path(prepare, cache)
    if path is None:
        path = download_wikitext2(cache, environ, TRAIN_MEMBER, _offline_hint(cache, environ))
    check_calibration_file(path, prepare.imatrix_ctx, scored)
    return path
