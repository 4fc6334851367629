"""The kv_types experiment's table, the KV-cache type trade-off: per quantization and cache type (K
and V alike), the KV memory, the decode speed through llama-server and the quality cost.

  memory   exact: `predict_kv` on the model's shape and the servers' slot layout as kv.json
           records them (the same arithmetic the KV check confirms), beside what the server of that
           type reported in its log (kv.json: `results` for the type a quantization's own server
           ran, `cache_types` for the kv_types experiment's other servers)
  speed    the kv_types experiment's stage on that server: output tok/s over the stage, TPOT and
           TTFT p50 (decode-heavy requests, the same on every server, so they compare)
  quality  quality.json's KLD from F16 measured with that cache type
Each is also given relative to the f16 cache of the same quantization.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis.fmt import cell_float
from quantload.analysis.run_data import RunData
from quantload.comparison import compare_medians
from quantload.errors import ModelError
from quantload.experiments.kv_types.stages import NAME
from quantload.kvcache import MIB, KvShape, predict_kv
from quantload.quality.kld_results import FLOOR_CACHE_TYPE, mean_error_nats
from quantload.rundir.kv_file import KvResult

BASE_CACHE_TYPE = "f16"

KV_TYPE_COLUMNS: tuple[str, ...] = (
    "quant", "cache_type", "own_server", "kv_predicted_mib", "kv_reported_mib", "kv_vs_f16_frac",
    "flash_attn", "users", "requests", "status", "output_tok_s", "output_vs_f16_frac", "tpot_p50_s",
    "ttft_p50_s", "kld_mean_nats", "kld_mean_error_nats", "kld_added_nats", "same_top_p_pct",
    "ppl_change_pct", "decode_vs_f16", "decode_vs_f16_low", "decode_vs_f16_high", "decode_faster",
)  # fmt: skip


def _shape_entry(run: RunData, quant: str) -> KvResult | None:
    """A kv.json entry of `quant` that records the model's shape and the slot layout."""
    entries = [run.kv_results.get(quant)]
    if run.kv is not None:
        entries += list(run.kv.cache_types.get(quant, {}).values())
    for entry in entries:
        if entry is not None and entry.n_layer and entry.n_head_kv and entry.slots and entry.ctx_per_slot:
            return entry
    return None


def predicted_mib(entry: KvResult, cache_type: str) -> float | None:
    """The KV MiB llama-server allocates for `entry`'s model and layout with `cache_type` K and V;
    None when the type does not fit the model's rows (llama.cpp refuses it) or a factor is missing."""
    if not (entry.n_layer and entry.n_head_kv and entry.head_dim_k and entry.head_dim_v):
        return None
    if not (entry.slots and entry.ctx_per_slot):
        return None
    shape = KvShape(
        n_layer=entry.n_layer, n_head_kv=tuple(entry.n_head_kv), head_dim_k=entry.head_dim_k,
        head_dim_v=entry.head_dim_v, n_ctx_train=0, source=entry.shape_source or "kv.json",
    )  # fmt: skip
    try:
        prediction = predict_kv(
            shape, entry.slots, entry.ctx_per_slot, cache_type, cache_type, bool(entry.unified)
        )
    except ModelError:
        return None
    return prediction.total_bytes / MIB


def served_cache_type(run: RunData, quant: str) -> str | None:
    """The cache type (K and V alike) of the quantization's own server; None when K and V differ."""
    own = run.kv_results.get(quant)
    if own is not None and own.cache_type_k is not None:
        return own.cache_type_k if own.cache_type_k == own.cache_type_v else None
    if run.settings is not None:
        server = run.settings.server
        return server.cache_type_k if server.cache_type_k == server.cache_type_v else None
    return None


def _checked(run: RunData, quant: str, cache_type: str, own: bool) -> KvResult | None:
    """The kv.json entry of the server that ran `quant` with `cache_type`."""
    if own:
        return run.kv_results.get(quant)
    return run.kv.cache_types.get(quant, {}).get(cache_type) if run.kv is not None else None


def measured_cache_types(run: RunData, stages: pd.DataFrame) -> list[str]:
    """The cache types anything was measured with: a KLD, a kv_types server's check or stage."""
    found: list[str] = []
    if run.quality is not None and run.quality.kld is not None:
        found += [t for per in run.quality.kld.results.values() for t in per]
    if run.kv is not None:
        found += [t for per in run.kv.cache_types.values() for t in per]
    if not stages.empty and "kv_cache_type" in stages:
        found += [str(t) for t in stages[stages["experiment"] == NAME]["kv_cache_type"].dropna()]
    return list(dict.fromkeys(found))


def cache_types_of(run: RunData, stages: pd.DataFrame) -> list[str]:
    """f16 (the base of every comparison), the configured ones (quality.kld_cache_types), then any
    other measured ones."""
    found: list[str] = list(run.settings.quality.kld_cache_types) if run.settings is not None else []
    every = list(dict.fromkeys([*found, *measured_cache_types(run, stages)]))
    if BASE_CACHE_TYPE not in every:
        return every
    return [BASE_CACHE_TYPE, *(t for t in every if t != BASE_CACHE_TYPE)]


def _stage(stages: pd.DataFrame, quant: str, cache_type: str) -> dict[str, Any]:
    """The kv_types stage of `quant` on `cache_type`: the last complete one, else the last one."""
    if stages.empty or "kv_cache_type" not in stages:
        return {}
    chosen = stages["experiment"].eq(NAME) & stages["quant"].eq(quant)
    mine = stages[chosen & stages["kv_cache_type"].eq(cache_type)]
    if mine.empty:
        return {}
    complete = mine[mine["status"] == "ok"]
    return dict((complete if not complete.empty else mine).iloc[-1].to_dict())


def _relative(value: float | None, base: float | None) -> float | None:
    return value / base - 1.0 if value is not None and base else None


DECIDED_COLUMNS = ("decode_vs_f16", "decode_vs_f16_low", "decode_vs_f16_high", "decode_faster")


def _tpots(run: RunData, stages: pd.DataFrame, quant: str, cache_type: str) -> list[float]:
    stage = _stage(stages, quant, cache_type)
    records = run.records
    if not stage or records.empty:
        return []
    mine = records[records["stage_id"].eq(stage.get("stage_id")) & records["ok"] & ~records["warmup"]]
    return [float(x) for x in mine["tpot_s"].dropna()]


def _decide_tpot(run: RunData, stages: pd.DataFrame, quant: str, rows: list[dict[str, Any]]) -> None:
    """Each cache type's decode against the f16 cache's, decided (quantload.comparison): f16's median
    TPOT over this type's, with its bootstrap interval; faster or slower only where it shows."""
    base = _tpots(run, stages, quant, BASE_CACHE_TYPE)
    for row in rows:
        mine = _tpots(run, stages, quant, str(row["cache_type"]))
        if row["cache_type"] == BASE_CACHE_TYPE or not base or not mine:
            row.update(dict.fromkeys(DECIDED_COLUMNS))
            continue
        comparison = compare_medians(base, mine)  # f16's TPOT over this type's: above 1, this decodes faster
        row.update(
            decode_vs_f16=comparison.ratio, decode_vs_f16_low=comparison.low,
            decode_vs_f16_high=comparison.high, decode_faster=comparison.better,
        )  # fmt: skip


def kv_type_table(run: RunData, stages: pd.DataFrame, quants: Sequence[str]) -> pd.DataFrame:
    """One row per (quantization, cache type) with anything known (see the module docstring);
    empty unless something was measured with at least two cache types."""
    kld = run.quality.kld if run.quality is not None else None
    rows: list[dict[str, Any]] = []
    if len(measured_cache_types(run, stages)) < 2:  # nothing to trade off
        return pd.DataFrame(columns=list(KV_TYPE_COLUMNS))
    types = cache_types_of(run, stages)
    for quant in quants:
        shape = _shape_entry(run, quant)
        losses = kld.results.get(quant, {}) if kld is not None else {}
        mine: list[dict[str, Any]] = []
        served = served_cache_type(run, quant)
        for cache_type in types:
            own = cache_type == served
            entry = _checked(run, quant, cache_type, own)
            stage = _stage(stages, quant, cache_type)
            loss = losses.get(cache_type)
            predicted = predicted_mib(shape, cache_type) if shape is not None else None
            if predicted is None and not stage and loss is None:
                continue
            mine.append(
                {
                    "quant": quant,
                    "cache_type": cache_type,
                    "own_server": own,
                    "kv_predicted_mib": predicted,
                    "kv_reported_mib": entry.reported_mib if entry is not None else None,
                    "flash_attn": entry.flash_attn if entry is not None else None,
                    "users": cell_float(stage.get("users")),
                    "requests": cell_float(stage.get("ok")),
                    "status": stage.get("status"),
                    "output_tok_s": cell_float(stage.get("output_tok_s")),
                    "tpot_p50_s": cell_float(stage.get("tpot_p50_s")),
                    "ttft_p50_s": cell_float(stage.get("ttft_p50_s")),
                    "kld_mean_nats": loss.kld_mean_nats if loss is not None else None,
                    "kld_mean_error_nats": mean_error_nats(loss) if loss is not None else None,
                    "same_top_p_pct": loss.same_top_p_pct if loss is not None else None,
                    "ppl_change_pct": loss.ppl_change_pct if loss is not None else None,
                }
            )
        base = next((r for r in mine if r["cache_type"] == BASE_CACHE_TYPE), None)
        _decide_tpot(run, stages, quant, mine)
        base_loss = losses.get(FLOOR_CACHE_TYPE)
        for row in mine:
            base_kv, base_out = (base["kv_predicted_mib"], base["output_tok_s"]) if base else (None, None)
            row["kv_vs_f16_frac"] = _relative(row["kv_predicted_mib"], base_kv)
            row["output_vs_f16_frac"] = _relative(row["output_tok_s"], base_out)
            row["kld_added_nats"] = (
                row["kld_mean_nats"] - base_loss.kld_mean_nats
                if row["kld_mean_nats"] is not None and base_loss is not None
                else None
            )
        rows += mine
    return pd.DataFrame(rows, columns=list(KV_TYPE_COLUMNS))
