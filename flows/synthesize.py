"""The synthesize flow: `traceops synthesize` and the nightly flow's third stage."""

from __future__ import annotations

from typing import Any

from prefect import flow

from traceops import config, versioning
from traceops.hashing import file_hash
from traceops.heldout import RequestParams
from traceops.results import SynthesizeResult
from traceops.tasks.cache import run_cached, stage_key
from traceops.tasks.synthesize import environments_exist, selected_capabilities, synthesize_task


@flow(name="traceops-synthesize")
def synthesize_flow(home: str | None = None, capabilities: list[str] | None = None,
                    calibrate_model: str | None = None, diagnosis_run: str | None = None,
                    parent_run_id: str | None = None,
                    overrides: dict[str, Any] | None = None) -> SynthesizeResult:
    """Synthesize environments for the given (default: the diagnosis' selected) capabilities.

    ``overrides`` replace keys of params.yaml's ``synthesize`` section for this run.
    """
    settings = config.load(home)
    chosen = list(capabilities) if capabilities else selected_capabilities(settings.paths.diagnosis)
    diagnosis_file = settings.paths.diagnosis / "capabilities.json"
    data_version = versioning.data_version(settings.paths.home, "data/curated")
    key = stage_key("synthesize", sorted(chosen), data_version,
                    file_hash(diagnosis_file) if diagnosis_file.exists() else None,
                    settings.stage("synthesize"), overrides, calibrate_model,
                    # the held-out split decides which logs may ground the environments
                    RequestParams.from_params(settings.stage("evaluate").get("requests")).cache_identity())
    return run_cached(synthesize_task, environments_exist, key=key, capabilities=chosen, home=home,
                      calibrate_model=calibrate_model, diagnosis_run=diagnosis_run,
                      parent_run_id=parent_run_id, overrides=overrides)
