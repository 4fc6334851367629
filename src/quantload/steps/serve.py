"""The serve step: a llama-server of one file, its KV cache checked against the prediction, its
layers' placement checked against `server.gpu_layers`, and the GPUs watched idle before a load."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from quantload.config import ServerSettings
from quantload.errors import QuantloadError
from quantload.kvcache import KvPrediction, kv_shape_from_gguf, predict_kv
from quantload.kvcheck import KvCheck, kv_check_from_log, merge_kv_file
from quantload.llamacpp.kld import needs_flash_attention
from quantload.llamacpp.offload import OffloadCheck, check_offload, parse_offload
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.models.gguf_meta import read_gguf
from quantload.rundir.gpu_file import IdleWindow, add_idle_window, merge_offload


def server_spec(
    settings: ServerSettings, model_path: Path, alias: str, slot_save_path: Path | None = None
) -> ServerSpec:
    """How the server of `model_path` is launched; `slot_save_path` lets the load erase slots."""
    return dataclasses.replace(
        ServerSpec.from_settings(settings, model_path, alias), slot_save_path=slot_save_path
    )


def cache_type_spec(spec: ServerSpec, cache_type: str) -> ServerSpec:
    """`spec` with K and V caches of `cache_type`, and flash attention on where a quantized V cache
    needs it (the rule the KLD runs follow); the port is picked afresh."""
    extra = tuple(spec.extra_args)
    if needs_flash_attention(cache_type) and not {"-fa", "--flash-attn"} & set(extra):
        extra += ("-fa", "on")
    return dataclasses.replace(
        spec, cache_type_k=cache_type, cache_type_v=cache_type, port=0, extra_args=extra
    )


def kv_prediction(spec: ServerSpec) -> KvPrediction:
    """The KV-cache size the spec's layout allocates, from the model's GGUF metadata."""
    return predict_kv(
        kv_shape_from_gguf(read_gguf(spec.model_path)),
        spec.slots,
        spec.ctx_per_slot,
        spec.cache_type_k,
        spec.cache_type_v,
        spec.kv_unified,
    )


def check_kv(
    server: LlamaServer, label: str, out: Path | None = None, llama_cpp: dict[str, object] | None = None
) -> KvCheck:
    """The prediction against the size the running server logged (it runs with -lv 4).

    With `out`, the outcome (or why there is none) is filed in that kv.json under `label`.
    """
    try:
        check = kv_check_from_log(kv_prediction(server.spec), server.log_text(), server.log_path)
    except QuantloadError as error:
        if out is not None:
            merge_kv_file(out, label, error.one_line(), llama_cpp)
        raise
    if out is not None:
        merge_kv_file(out, label, check, llama_cpp)
    return check


def check_server_offload(server: LlamaServer, label: str, out: Path | None = None) -> OffloadCheck:
    """The layers the server was asked to put on the GPU against those its latest launch logged;
    with `out`, filed in that gpu.json under `label`."""
    check = check_offload(server.spec.gpu_layers, parse_offload(server.launch_log_text()))
    if out is not None:
        merge_offload(out, label, check)
    return check


def watch_idle(
    quants: Sequence[str],
    seconds: float,
    out: Path,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> IdleWindow:
    """Let the servers of `quants` sit idle for `seconds` (nothing is sent to them) and file the
    span in gpu.json: the GPUs' draw then is their idle baseline (analysis.gpu_energy)."""
    start = clock()
    sleep(seconds)
    window = IdleWindow(quants=tuple(quants), start_unix_s=start, end_unix_s=clock())
    add_idle_window(out, window)
    return window
