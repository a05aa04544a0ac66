"""The diagnose flow: `traceops diagnose` and the nightly flow's second stage."""

from __future__ import annotations

from prefect import flow

from traceops import config, versioning
from traceops.results import DiagnoseResult
from traceops.tasks.cache import run_cached, stage_key
from traceops.tasks.diagnose import diagnose_task, diagnosis_outputs_exist


def diagnose_key(home: str | None, labelers: tuple[str, ...],
                 llm_model: str | None = None) -> tuple[str, str | None]:
    """The cache key of a diagnosis: the curated data version, the diagnose parameters, the labelers and
    the LLM labeler's model."""
    settings = config.load(home)
    data_version = versioning.data_version(settings.paths.home, "data/curated")
    key = stage_key("diagnose", data_version, settings.stage("diagnose"), list(labelers), llm_model)
    return key, data_version


@flow(name="traceops-diagnose")
def diagnose_flow(home: str | None = None, labelers: tuple[str, ...] = ("rule",),
                  parent_run_id: str | None = None, llm_model: str | None = None) -> DiagnoseResult:
    """Diagnose the curated store (cached by data version and parameters)."""
    key, data_version = diagnose_key(home, labelers, llm_model)
    return run_cached(diagnose_task, diagnosis_outputs_exist, key=key, home=home, labelers=labelers,
                      data_version=data_version, parent_run_id=parent_run_id, llm_model=llm_model)
