"""What a tune's trial must show before its figures rank a configuration.

- A configuration that speculates must have drafted: its server's startup log and `/slots` are
  read before the trial, and its draft counters (`/metrics`, each request's timings) after it,
  as the speculation experiment reads them (quantload.experiments.speculation.probe). A variant
  that never drafted measured the server without speculation: its trial is not a measurement of the
  configuration, and it is never recommended.
- The variant's server must still answer when the trial ends. One killed or crashed mid-trial
  fails its levels with refused connections; that is not the configuration missing the SLO.

A trial that fails either check ranks as not measured, with the reason (quantload.tune.halving).
"""

from __future__ import annotations

import httpx

from quantload.experiments.base import ServedVariant
from quantload.experiments.speculation.probe import check_after, check_before
from quantload.experiments.speculation.stages import request_drafts
from quantload.experiments.variant_file import SpeculationCheck
from quantload.run_context import RunContext
from quantload.served import ServedTarget

HEALTH_TIMEOUT_S = 5.0


def speculation_before(speculates: bool, variant: ServedVariant) -> SpeculationCheck | None:
    """The check of a speculating variant before its trial (None: it is not asked to speculate)."""
    return check_before(variant.target, variant.startup_log) if speculates else None


def speculation_after(
    before: SpeculationCheck | None, run: RunContext, variant: ServedVariant, stage_ids: set[str]
) -> SpeculationCheck | None:
    """The check once the trial's stages ran: no draft token counted means it did not speculate."""
    if before is None or not before.speculating:
        return before
    drafts, requests = request_drafts(run.run_dir, stage_ids)
    return check_after(variant.target, before, drafts, requests)


def server_gone(target: ServedTarget) -> str | None:
    """Why the variant's server is not there any more (None: it answers)."""
    key = target.api_key.get_secret_value() if target.api_key is not None else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(timeout=HEALTH_TIMEOUT_S) as client:
            client.get(f"{target.url}/health", headers=headers)
    except httpx.HTTPError as error:
        return (
            f"its llama-server stopped answering during the trial ({type(error).__name__}): killed or"
            " crashed, so its failed levels do not say the configuration missed the SLO"
        )
    return None
