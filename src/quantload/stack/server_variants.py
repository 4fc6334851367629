"""Variants of a llama-server quantload started: the same file with other flags, for an experiment.

`ServerVariants` is the run's `ServerControl` (quantload.experiments.base). A variant's spec is
the server's own with the flags applied (slots, context per slot, KV-cache type with flash
attention where a quantized V cache needs it, extra flags added); its KV cache is checked against
the prediction from the lines the variant itself logged.

- A server that runs alone is restarted in place: stopped, started with the variant's spec on the
  same port, under the same names (so the exporter's target stays valid and the variant's series
  are the quantization's), logging to the same file; when the context ends it is restarted as it
  was. A variant that fails to start is replaced by the configured server at once, before its
  error is raised: the next variant starts from the configured flags, and the run's server is
  still there for the experiments after it.
- Where every quantization's server runs at once, the variant is a second llama-server of the same
  file on a free port (named `<server>-<label>`, its own log), stopped when the context ends: the
  others keep running untouched.

`adopt` restarts the server in place with other flags for the rest of the run (what a tuned run
serves with); variants taken afterwards start from the adopted flags.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import SecretStr

from quantload.errors import QuantloadError, ServerError
from quantload.experiments.base import ServedVariant, ServerFlags
from quantload.experiments.running import label as file_label
from quantload.kvcheck import KvCheck, kv_check_from_log, kv_prediction
from quantload.llamacpp.kld import needs_flash_attention
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import Toolchain
from quantload.served import ServedTarget


def cache_type_spec(spec: ServerSpec, cache_type: str) -> ServerSpec:
    """`spec` with K and V caches of `cache_type`, and flash attention on where a quantized V cache
    needs it (the rule the KLD runs follow); the port is picked afresh."""
    extra = tuple(spec.extra_args)
    if needs_flash_attention(cache_type) and not {"-fa", "--flash-attn"} & set(extra):
        extra += ("-fa", "on")
    return dataclasses.replace(
        spec, cache_type_k=cache_type, cache_type_v=cache_type, port=0, extra_args=extra
    )


def variant_spec(spec: ServerSpec, flags: ServerFlags) -> ServerSpec:
    """`spec` with `flags` applied (the port kept: the caller decides it). The cache type goes
    last, so flash attention is added for a quantized V cache only where the flags do not set it."""
    spec = dataclasses.replace(
        spec,
        slots=flags.slots if flags.slots is not None else spec.slots,
        ctx_per_slot=flags.ctx_per_slot if flags.ctx_per_slot is not None else spec.ctx_per_slot,
        extra_args=(*spec.extra_args, *flags.extra_args),
        gpu_layers=flags.gpu_layers if flags.gpu_layers is not None else spec.gpu_layers,
    )
    if flags.cache_type is not None:
        spec = dataclasses.replace(cache_type_spec(spec, flags.cache_type), port=spec.port)
    return spec


def _kv(server: LlamaServer) -> tuple[KvCheck | None, str | None]:
    try:
        return kv_check_from_log(kv_prediction(server.spec), server.launch_log_text(), server.log_path), None
    except QuantloadError as error:
        return None, error.one_line()


class ServerVariants:
    """The `ServerControl` of one started llama-server (see the module docstring)."""

    def __init__(
        self,
        server: LlamaServer,
        target: ServedTarget,
        toolchain: Toolchain,
        logs: Path,
        in_place: bool,
        planned: Callable[[str], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.server = server
        self.target = target
        self.toolchain = toolchain
        self.logs = logs
        self.in_place = in_place
        # how a restart is announced to whoever watches the server (the exporter), so its down time
        # is not taken for a fault
        self.planned = planned or (lambda name: contextlib.nullcontext())

    def server_pid(self) -> int | None:
        return self.server.pid if self.server.alive() else None

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        if self.in_place:
            with self._restarted(flags) as variant:
                yield variant
        else:
            with self._beside(flags) as variant:
                yield variant

    @contextlib.contextmanager
    def _restarted(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        server = self.server
        own, port = dataclasses.replace(server.spec, port=server.port), server.port
        self._start_or_restore(variant_spec(own, flags), own)
        try:
            kv, why = _kv(server)
            target = self.target.model_copy(update={"url": server.url})
            yield ServedVariant(target, flags, kv, why, server.launch_log_text())
        finally:
            self._restart(own, port)

    def adopt(self, flags: ServerFlags) -> ServedVariant:
        """Restart the server in place with `flags` for good (see the module docstring)."""
        server = self.server
        own = dataclasses.replace(server.spec, port=server.port)
        self._start_or_restore(variant_spec(own, flags), own)
        kv, why = _kv(server)
        target = self.target.model_copy(update={"url": server.url})
        return ServedVariant(target, flags, kv, why, server.launch_log_text())

    def _start_or_restore(self, spec: ServerSpec, own: ServerSpec) -> None:
        """Restart with `spec`; where that fails, restart with `own` before raising its error."""
        try:
            self._restart(spec, own.port)
        except QuantloadError:
            try:
                self._restart(own, own.port)
            except QuantloadError as error:
                raise ServerError(
                    f"the configured llama-server did not come back after a variant failed: {error.problem}",
                    error.hint,
                ) from None
            raise

    def _restart(self, spec: ServerSpec, port: int) -> None:
        server = self.server
        with self.planned(self.target.name):
            server.stop()
            server.spec = spec
            server.start()
        if server.port != port:  # the port was taken meanwhile: the exporter's target is stale now
            raise ServerError(
                f"llama-server restarted on port {server.port}, not {port} (the port was taken)",
                "the exporter watches the old address; rerun the experiment",
            )

    @contextlib.contextmanager
    def _beside(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        spec = variant_spec(dataclasses.replace(self.server.spec, port=0), flags)  # the adopted flags too
        tag = file_label(flags.label or "variant")
        log_path = self.logs / f"llama-server-{self.target.quant}-{tag}.log"
        other = LlamaServer(self.toolchain, spec, log_path, self.server.startup_timeout_s)
        try:
            other.start()
            kv, why = _kv(other)
            key = spec.api_key
            target = self.target.model_copy(
                update={
                    "name": f"{self.target.name}-{tag}",
                    "url": other.url,
                    "api_key": SecretStr(key) if key else None,
                }
            )
            yield ServedVariant(target, flags, kv, why, other.launch_log_text())
        finally:
            other.stop()
