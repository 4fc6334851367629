"""`--files a.gguf b.gguf ...`: the files after --files, as one list (typer takes one value per
--files, so the others arrive as the command's trailing arguments)."""

from __future__ import annotations

from quantload.errors import ConfigError


def given_files(files: list[str] | None, trailing: list[str] | None) -> list[str] | None:
    """The files named after --files (repeated or not); ConfigError for trailing arguments
    without --files."""
    if trailing and not files:
        raise ConfigError(
            f"unexpected argument(s): {' '.join(trailing)}",
            "name files to measure with --files FILE [FILE...]",
        )
    return [*(files or []), *(trailing or [])] or None


def quant_labels(text: str | None, flag: str = "--quants") -> tuple[str, ...] | None:
    """`--quants Q8_0,Q4_K_M` as labels (None when the flag is not given); ConfigError for a value
    that names none, instead of taking the defaults in silence."""
    if text is None:
        return None
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    if not labels:
        raise ConfigError(
            f"{flag} {text!r} names no quantization",
            f"give types, e.g. {flag} Q8_0,Q4_K_M, or leave {flag} out for prepare.quants",
        )
    return labels
