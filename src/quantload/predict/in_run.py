"""The prediction as a step of `quantload run` (RunSteps.predict): one file's cost curves measured
by llama-batched-bench with the flags the run's server uses, written to costs-<quant>.json, then
the scheduler simulated with the run's workload and SLO, the prediction added to predict.json
under the quantization's name. `quantload predict` measures and predicts with the same functions
(quantload.predict.measure, quantload.predict.prediction)."""

from __future__ import annotations

from pathlib import Path

from quantload.config import Settings
from quantload.llamacpp.toolchain import Toolchain
from quantload.predict.costs import write_costs_file
from quantload.predict.measure import GEN_TOKENS, describe, measure_costs, measuring_grid
from quantload.predict.prediction import (
    FilePrediction,
    client_timing,
    merge_predict_file,
    predict_file,
    search_budget,
    search_rules,
    server_flags_used,
)
from quantload.predict.workload_shapes import WorkloadShapes
from quantload.progress import ProgressCallback
from quantload.rundir.handle import RunDir
from quantload.slo import Slo

PREDICT_MAX_USERS = 64  # the most users a run's prediction simulates


def users_to_predict(settings: Settings) -> int:
    """The most users the run's load may try: the limit search's limit.max_users or the sweep's
    highest level, whichever is larger, at most PREDICT_MAX_USERS."""
    highest = max((int(users) for users in settings.load.users), default=1)
    return max(1, min(PREDICT_MAX_USERS, max(settings.limit.max_users, highest)))


def predict_in_run(
    toolchain: Toolchain,
    model: Path,
    quant: str,
    settings: Settings,
    shapes: WorkloadShapes,
    run_dir: Path,
    progress: ProgressCallback,
) -> FilePrediction:
    """Measure `model`'s cost curves (costs-<quant>.json), predict its limit with the run's
    settings and add it to predict.json; a QuantloadError when a tool fails or is missing."""
    files = RunDir(run_dir)
    flags = server_flags_used(settings)
    npp, npl = measuring_grid(shapes, flags)
    repeats = settings.predict.repeats
    progress(0, 2, f"llama-batched-bench -npp {','.join(map(str, npp))} -npl {','.join(map(str, npl))}")
    costs = measure_costs(
        toolchain, model, npp, (GEN_TOKENS,), npl, flags.threads, flags.n_batch, flags.n_ubatch,
        log_path=files.log_path(f"llama-batched-bench-{quant}.log"), repeats=repeats,
    )  # fmt: skip
    write_costs_file(files.costs_path_of(quant), costs)
    error = describe(costs).splitlines()[-1].strip()
    most = users_to_predict(settings)
    progress(1, 2, f"simulating 1 to {most} users ({error})")
    prediction = predict_file(
        quant, costs, flags, shapes, Slo.of(settings.slo), most, settings.predict.requests_per_level,
        seed=settings.load.seed, client=client_timing(settings),
        search=(search_budget(settings), search_rules(settings)),
    )  # fmt: skip
    merge_predict_file(files.predict_path, prediction)
    progress(2, 2, prediction.sentence())
    return prediction
