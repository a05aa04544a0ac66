"""What each stage hands the next (DESIGN.md, Contracts): plain pydantic classes, no hidden logic.

A stage task returns one of these; flows, the CLI and the benchmarks read its fields. Prefect's JSON
result serializer stores a model with its class path and validates it back into the same class, so a
cached result is the same typed object as a fresh one. Field order is the order of the CLI's
``--json`` keys (``model_dump(mode="json")``); paths are strings so that the JSON form is plain.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VersionRef(_Result):
    """A registered model version by name and version."""

    name: str
    version: str


class IngestResult(_Result):
    """The ingest stage: counts of what was read, the curated data version and the stage run."""

    read: int
    accepted: int
    duplicates: int
    quarantined: int
    # Of the accepted: stored records replaced because their outcome arrived late (traceops.ingest).
    outcomes_updated: int = 0
    data_version: str
    quarantine_reasons: dict[str, int]
    # Accepted records with a warning (an auxiliary field kept in metadata), by warning.
    warnings: dict[str, int] = Field(default_factory=dict)
    mlflow_run: str


class SelectedCapability(_Result):
    """One capability the diagnosis selected, with its selection statistics."""

    capability: str
    coverage: float | None
    delta: float | None
    ci: list[float] | None
    p_value: float | None
    stable_runs: int


class DiagnoseResult(_Result):
    """The diagnose stage: the selected capabilities, the report and output files, the stage run."""

    selected: list[SelectedCapability]
    report: str | None
    files: dict[str, str]  # output name -> path
    mlflow_run: str
    trajectories: int


class EnvironmentSummary(_Result):
    """One synthesized capability: tasks per split and whether its self-tests passed."""

    capability: str
    train: int
    val: int
    test: int
    self_tests_passed: bool


class SkippedCapability(_Result):
    """A requested capability that got no environments, and why."""

    capability: str
    reason: str


class SynthesizeResult(_Result):
    """The synthesize stage: the environments written, the DVC env version, what was skipped."""

    environments: list[EnvironmentSummary]
    env_version: str
    skipped: list[SkippedCapability]
    capabilities: list[str]
    out_dir: str
    mlflow_run: str


class AdapterResult(_Result):
    """One capability's trained and registered adapter, with its success before and after training."""

    capability: str
    model_name: str
    model_version: str
    mlflow_run: str
    adapter_path: str
    adapter_hash: str
    val_success_before: float | None
    val_success_after: float | None
    test_success_before: float | None
    test_success_after: float | None
    sft_steps: int
    grpo_steps: int
    dropped_constant_groups: int
    grpo_skipped_updates: int
    resumed_from: dict[str, int | None]  # phase -> step the run resumed from
    seconds: float


class GenericResult(_Result):
    """The generic LoRA baseline (trained on every capability; evaluated, never registered)."""

    adapter_path: str
    mlflow_run: str
    capabilities: list[str]
    sft_steps: int
    val_success_after: dict[str, float | None]
    seconds: float


class PlannedCapability(_Result):
    """The night's training plan for one capability (traceops/train/plan.py), in rank order of coverage x
    gap: trained with ``sft_steps`` + ``grpo_steps`` costing ``cost`` reference steps, reused (cost 0),
    or ``deferred`` (the reason) to a later night."""

    capability: str
    rank: int
    score: float
    sft_steps: int
    grpo_steps: int
    cost: float
    reused: bool
    deferred: str | None = None
    least_cost: float | None = None  # reference steps of its shortest schedule, where it was priced


class TrainResult(_Result):
    """The train stage: one adapter per capability and the generic LoRA when it was trained."""

    adapters: list[AdapterResult]
    generic: GenericResult | None = None
    time_budget: float | None = None  # train.time_budget in reference steps
    plan: list[PlannedCapability] = Field(default_factory=list)


class RouteResult(_Result):
    """The route stage: registered router and composite, the composite folder and the fit's figures."""

    key: str  # the cache key the composite folder was fitted under
    router: VersionRef
    composite: VersionRef
    composite_path: str
    parent_versions: dict[str, str]  # registered model name -> version
    routing: dict[str, Any]  # flat fit metrics, plus "val": the val routing summary per capability
    mlflow_run: str  # the run that fitted the routers


class RoleSummary(_Result):
    """One evaluated role: where its weights came from and its headline numbers."""

    kind: str
    ref: VersionRef | None
    path: str | None
    capability: str | None
    model_id: str
    weights_hash: str | None
    success: dict[str, float | None]  # capability -> success on its held-out split
    success_overall: float | None
    pass_k: float | None
    mean_reward: float | None
    repeat_failure_rate: float | None
    refailure_rate: float | None
    replayed: int | None
    regression_overall: float | None
    seconds: float
    # 95% Wilson intervals [low, high] and test tasks per capability (defaults: results cached before)
    success_ci: dict[str, list[float] | None] = {}
    success_overall_ci: list[float] | None = None
    tasks: dict[str, int] = {}
    # Held-out real requests (evaluation.requests): success per domain, macro overall with its 95%
    # Wilson interval, graded requests per domain (empty when none were replayed)
    requests_success: dict[str, float | None] = {}
    requests_success_overall: float | None = None
    requests_success_overall_ci: list[float] | None = None
    requests_graded: dict[str, int] = {}
    requests_success_ci: dict[str, list[float] | None] = {}


class ReplaySummary(_Result):
    """Which domain's logged failures were replayed, how many, and the failure count of every domain."""

    domain: str | None
    failed: int
    failed_by_domain: dict[str, int]


class RequestsSummary(_Result):
    """The held-out real requests replayed by every role: the split, how many per domain, how many were
    not replayed (by reason), and each domain's grader."""

    heldout_fraction: float
    seed: int
    replayed: dict[str, int]  # domain -> requests replayed
    skipped: dict[str, int]  # reason -> requests not replayed
    graders: dict[str, str]  # domain -> grader spec


class PairedDifference(_Result):
    """A difference of success rates (candidate - reference) on the tasks both were evaluated on, with
    its paired bootstrap 95% interval."""

    delta: float | None
    low: float | None
    high: float | None
    tasks: int


class Comparison(_Result):
    """One paired comparison (composite vs champion, composite vs base): per capability and overall."""

    overall: PairedDifference | None
    capabilities: dict[str, PairedDifference]
    resamples: int
    seed: int


class EvalResult(_Result):
    """The evaluate stage: every role's summary, the report files and the stage run."""

    models: dict[str, RoleSummary]  # role -> summary, in evaluation order
    report_path: str
    eval_json: str
    mlflow_run: str
    capabilities: list[str]
    replay: ReplaySummary
    seconds: dict[str, float]  # role -> seconds
    comparisons: dict[str, Comparison] = {}  # "composite vs champion" / "composite vs base" -> paired
    requests: RequestsSummary | None = None  # the held-out real requests (None: evaluated before them)
    request_comparisons: dict[str, Comparison] = {}  # as comparisons, on them; capabilities = domains


class PromoteResult(_Result):
    """The promote stage: the decision, the champion after it, the gates' checks and the stage run."""

    promoted: bool
    changed: bool
    alias: str
    champion: VersionRef | None
    reasons: list[str]
    checks: dict[str, dict[str, Any]]
    aliases: dict[str, Any]
    candidate: VersionRef
    mlflow_run: str


class RollbackResult(_Result):
    """`traceops rollback`: champion moved back from ``rolled_back`` to ``champion``; who, why, when."""

    name: str
    rolled_back: VersionRef
    champion: VersionRef
    by: str
    reason: str
    at: str  # UTC ISO time
    aliases: dict[str, str]  # alias -> version after the rollback
    mlflow_run: str


class NightResult(_Result):
    """One nightly run: every stage's result (None for the stages a night with nothing to do skips)."""

    mlflow_run: str
    seconds: dict[str, float]  # stage -> wall seconds, and "total"
    ingest: IngestResult
    nothing_to_do: str | None = None
    diagnose: DiagnoseResult | None = None
    synthesize: SynthesizeResult | None = None
    train: TrainResult | None = None
    route: RouteResult | None = None
    evaluate: EvalResult | None = None
    promote: PromoteResult | None = None
