"""Prefect tasks for the synthesize stage: one environment family per selected capability."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from prefect import task

from traceops import config, versioning
from traceops.agent import model_episodes
from traceops.envs.synthesize import synthesize
from traceops.errors import StageError
from traceops.heldout import RequestParams, load_references, request_values, split_trajectories
from traceops.model.openai_compat import public_url
from traceops.reference_replies import answered_by_references
from traceops.results import EnvironmentSummary, SkippedCapability, SynthesizeResult
from traceops.store import load_trajectories
from traceops.tags import TAG_DIAGNOSIS_RUN, TAG_ENV_VERSION
from traceops.tasks.cache import CACHED
from traceops.tasks.retry import retry_unless_user_error
from traceops.tasks.tracking import log_json, stage_run, work_timer

ENVIRONMENTS = "data/environments"


def selected_capabilities(diagnosis_dir: Path) -> list[str]:
    """The capabilities the last diagnosis selected (capabilities.json), in rank order."""
    path = diagnosis_dir / "capabilities.json"
    if not path.exists():
        raise StageError(f"synthesize: {path} is missing; run `traceops diagnose` first")
    doc = json.loads(path.read_text())
    return [row["capability"] for row in doc.get("selected", [])]


def environments_exist(result: SynthesizeResult) -> bool:
    """Whether the environment folders a synthesize result names are still on disk."""
    root = Path(result.out_dir)
    return root.is_dir() and all((root / c / "manifest.json").exists() for c in result.capabilities)


def _swap_in(fresh: Path, target: Path) -> None:
    """Replace ``target`` by ``fresh`` so that no stale capability folder of an earlier night survives."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    fresh.rename(target)
    shutil.rmtree(old, ignore_errors=True)


@task(name="synthesize", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error,
      **CACHED)
def synthesize_task(key: str, capabilities: list[str], home: str | None = None,
                    calibrate_model: str | None = None, diagnosis_run: str | None = None,
                    parent_run_id: str | None = None,
                    overrides: dict[str, Any] | None = None) -> SynthesizeResult:
    """Generate, self-test (and optionally calibrate) environments; version them with DVC.

    ``key`` (diagnosis + data version + parameters) is the cache key, so unchanged inputs are not
    synthesized twice; the output is byte-identical for the same inputs, so the env_version is stable.
    """
    import mlflow

    settings = config.load(home)
    params = {**settings.stage("synthesize"), **(overrides or {})}
    seed = int(params.pop("seed", 0))
    paths = settings.paths
    # A model URL may carry credentials (user:key@host): log it without them.
    shown_model = public_url(calibrate_model) if calibrate_model else None
    with stage_run(settings, "synthesize", parent_run_id,
                   params={"capabilities": ",".join(capabilities), "seed": seed,
                           "calibrate_model": shown_model}) as run:
        with work_timer():
            # Held-out real requests (evaluate.requests) never ground training: evaluation replays them.
            held = RequestParams.from_params(settings.stage("evaluate").get("requests"))
            trajectories, heldout = split_trajectories(load_trajectories(paths), held.seed,
                                                       held.heldout_fraction)
            # The reference replies of train-side requests teach: a failed request is mined with its
            # right reply (the held-out side's references only score evaluation).
            phrasing = (answered_by_references(trajectories, load_references(held.references))
                        if held.references else None)
            episodes = model_episodes(calibrate_model) if calibrate_model else None
            fresh = paths.data / ".environments.new"
            shutil.rmtree(fresh, ignore_errors=True)
            result = synthesize(capabilities, trajectories, fresh, params, seed=seed, episodes=episodes,
                                exclude=sorted(request_values(heldout)), phrasing=phrasing)
        _swap_in(fresh, paths.environments)
        env_version = versioning.commit_data(paths.home, ENVIRONMENTS)
        mlflow.set_tag(TAG_ENV_VERSION, env_version)
        mlflow.set_tag(TAG_DIAGNOSIS_RUN, diagnosis_run or "")
        for capability, manifest in result.manifests.items():
            tests = manifest["self_tests"]
            mlflow.log_metric(f"self_tests_passed.{capability}", float(bool(tests["passed"])))
            for split in ("train", "val", "test"):
                mlflow.log_metric(f"tasks.{capability}.{split}", manifest["counts"][split])
            log_json(manifest, f"manifests/{capability}.json")
        log_json(result.skipped, "skipped.json")
    environments = [
        EnvironmentSummary(capability=c, **{s: m["counts"].get(s, 0) for s in ("train", "val", "test")},
                           self_tests_passed=bool(m["self_tests"]["passed"]))
        for c, m in sorted(result.manifests.items())
    ]
    return SynthesizeResult(environments=environments, env_version=env_version,
                            skipped=[SkippedCapability(**s) for s in result.skipped],
                            capabilities=sorted(result.manifests), out_dir=str(paths.environments),
                            mlflow_run=run.info.run_id)
