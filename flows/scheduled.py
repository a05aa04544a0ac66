"""The flow a Prefect deployment schedules (prefect.yaml): one night under the home's lock.

A worker imports Prefect before any traceops code runs, so the home comes from the ``home`` parameter or
``TRACEOPS_HOME`` in the worker's environment; the lock makes an overrunning night and the next scheduled
one queue up instead of racing on the same MLflow, DVC and Prefect state.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from traceops.flows import runtime
from traceops.flows.nightly import json_summary, nightly_flow


@flow(name="traceops-nightly-scheduled")
def scheduled_night(logs: list[str] | None = None, home: str | None = None,
                    wait_s: float = 3600.0) -> dict[str, Any]:
    """Run the nightly flow once on ``logs`` (default: the home's data/raw), waiting up to ``wait_s``
    seconds for a run that still holds the home."""
    settings = runtime.prepare(home)
    chosen = list(logs) if logs else [str(settings.paths.raw)]
    with runtime.home_lock(settings, wait_s=wait_s):
        result = nightly_flow(logs=chosen, home=str(settings.paths.home))
    return json_summary(result)
