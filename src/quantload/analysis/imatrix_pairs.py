"""What an importance matrix did: each type measured both with and without one, as a row pair
(mean KLD from the reference, same top token, perplexity, size).

Pairs come from the manifest: a file made with an importance matrix (its own quantize.imatrix.*
metadata says so) and a file of the same type and recipe made without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis.run_data import RunData
from quantload.analysis.run_tables import imatrix_text
from quantload.models.manifest import ManifestEntry
from quantload.quality.kld_results import FLOOR_CACHE_TYPE, beyond_uncertainty, mean_error_nats

PAIR_COLUMNS: tuple[str, ...] = (
    "pair", "quant", "file_type", "imatrix", "size_bytes", "kld_mean_nats", "kld_mean_error_nats",
    "same_top_p_pct", "perplexity", "perplexity_error", "kld_change_frac", "beyond_uncertainty",
)  # fmt: skip


def _plain_recipe(entry: ManifestEntry) -> str:
    """The recipe without the importance matrix: what the twin made without one is made with."""
    recipe = entry.recipe or entry.file_type
    return recipe.removesuffix(" with the importance matrix").removesuffix("-imatrix")


def pairs(run: RunData, quants: Sequence[str]) -> list[tuple[str, str]]:
    """(without, with) labels of every type measured both ways, in the run's order."""
    if run.manifest is None:
        return []
    files = run.manifest.files
    found = []
    for label in quants:
        entry = files.get(label)
        if entry is None or not entry.imatrix:
            continue
        recipe = _plain_recipe(entry)
        plain = [o for o in quants if o in files and not files[o].imatrix]
        plain = [o for o in plain if files[o].file_type == entry.file_type]
        twin = next((o for o in plain if _plain_recipe(files[o]) == recipe), None)
        if twin is not None:
            found.append((twin, label))
    return found


def imatrix_pair_table(run: RunData, quants: Sequence[str]) -> pd.DataFrame:
    """Two rows per pair (without, then with), the with-row carrying the change in mean KLD."""
    kld = run.quality.kld.for_cache_type(FLOOR_CACHE_TYPE) if run.quality and run.quality.kld else {}
    perplexity = run.quality.results if run.quality else {}
    rows: list[dict[str, Any]] = []
    assert run.manifest is not None or not pairs(run, quants)
    for index, (without, with_matrix) in enumerate(pairs(run, quants), start=1):
        for label in (without, with_matrix):
            entry = run.manifest.files[label] if run.manifest else None
            loss, ppl = kld.get(label), perplexity.get(label)
            other = kld.get(without)
            change = None
            if label == with_matrix and loss is not None and other is not None and other.kld_mean_nats > 0:
                change = loss.kld_mean_nats / other.kld_mean_nats - 1.0
            rows.append(
                {
                    "pair": index,
                    "quant": label,
                    "file_type": entry.file_type if entry else None,
                    "imatrix": imatrix_text(entry.imatrix) if entry else None,
                    "size_bytes": entry.size_bytes if entry else None,
                    "kld_mean_nats": loss.kld_mean_nats if loss else None,
                    "kld_mean_error_nats": mean_error_nats(loss) if loss else None,
                    "same_top_p_pct": loss.same_top_p_pct if loss else None,
                    "perplexity": ppl.perplexity if ppl else None,
                    "perplexity_error": ppl.perplexity_error if ppl else None,
                    "kld_change_frac": change,
                    "beyond_uncertainty": (
                        beyond_uncertainty(loss, other) if label == with_matrix and loss and other else None
                    ),
                }
            )
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS))
