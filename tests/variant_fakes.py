"""The server control of experiments that restart llama-server with other flags, as a fake: one
fake server (quantload.load.fakeserver) per variant, every variant asked for noted in `asked` and
every one started in `served`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from quantload.errors import ServerError
from quantload.experiments.base import ServedVariant, ServerFlags
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.served import ServedTarget

SCRIPT = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=6, close_after_stream=True)
TARGET = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1")
NO_KV_LINE = "the fake logs no KV line"


def never(flags: ServerFlags) -> bool:
    return False


class FakeVariants:
    """A fake server per variant. `script` may depend on the flags (its context, its slots);
    `refused` flags raise ServerError as a llama-server that never becomes ready; each started
    variant is `target` under the name `name(flags)` (default: the target's own), with no KV check
    and `startup_log` as what it logged."""

    def __init__(
        self,
        script: FakeScript | Callable[[ServerFlags], FakeScript] = SCRIPT,
        target: ServedTarget = TARGET,
        refused: Callable[[ServerFlags], bool] = never,
        name: Callable[[ServerFlags], str] | None = None,
        startup_log: str = "",
    ) -> None:
        self.script, self.target, self.refused, self.name = script, target, refused, name
        self.startup_log = startup_log
        self.asked: list[ServerFlags] = []
        self.served: list[ServerFlags] = []

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        self.asked.append(flags)
        if self.refused(flags):
            raise ServerError(f"llama-server with {flags.label or 'these flags'} did not become ready")
        script = self.script(flags) if callable(self.script) else self.script
        with FakeServer(script) as fake:
            self.served.append(flags)
            name = self.name(flags) if self.name is not None else self.target.name
            target = self.target.model_copy(update={"url": fake.url, "name": name})
            yield ServedVariant(target, flags, None, NO_KV_LINE, self.startup_log)

    def adopt(self, flags: ServerFlags) -> ServedVariant:
        raise AssertionError("the experiments do not adopt a variant")
