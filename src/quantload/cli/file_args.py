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
