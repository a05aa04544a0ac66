"""One typed settings object: the state home, its paths and params.yaml.

All state (data/, mlflow/, DVC, Prefect home) lives under one home directory: the current directory
by default, ``TRACEOPS_HOME`` to move it. Nothing here touches the file system except ``load``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from traceops.errors import ConfigError


@dataclass(frozen=True)
class Paths:
    """Every location traceops reads or writes, derived from the home."""

    home: Path

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def raw(self) -> Path:
        return self.data / "raw"

    @property
    def curated(self) -> Path:
        return self.data / "curated"

    @property
    def quarantine(self) -> Path:
        return self.data / "quarantine"

    @property
    def diagnosis(self) -> Path:
        return self.data / "diagnosis"

    @property
    def environments(self) -> Path:
        return self.data / "environments"

    @property
    def eval(self) -> Path:
        return self.data / "eval"

    @property
    def models(self) -> Path:
        """Working folders for trained adapters and routers before they are logged to MLflow."""
        return self.home / "models"

    @property
    def mlflow(self) -> Path:
        return self.home / "mlflow"

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{(self.mlflow / 'mlflow.db').as_posix()}"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.mlflow / "artifacts"

    @property
    def prefect_home(self) -> Path:
        return self.home / ".prefect"

    @property
    def dvc_remote(self) -> Path:
        return self.home / ".dvc-remote"

    @property
    def lock(self) -> Path:
        return self.home / ".traceops.lock"


@dataclass(frozen=True)
class Settings:
    """The home's paths plus the parameters of every stage (params.yaml merged over defaults)."""

    paths: Paths
    params: dict[str, Any] = field(default_factory=dict)

    def stage(self, name: str) -> dict[str, Any]:
        """Parameters of one stage (an empty dict when params.yaml has none)."""
        return dict(self.params.get(name) or {})


def resolve_home(home: str | Path | None = None) -> Path:
    """The state home: an explicit path, else ``TRACEOPS_HOME``, else the current directory."""
    chosen = home or os.environ.get("TRACEOPS_HOME") or Path.cwd()
    return Path(chosen).expanduser().resolve()


def cache_dir() -> Path:
    """Where converted model weights are cached: ``TRACEOPS_CACHE`` or the user's cache folder."""
    base = os.environ.get("TRACEOPS_CACHE")
    if base:
        return Path(base).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "traceops"


def load(home: str | Path | None = None) -> Settings:
    """Settings for a home: its params.yaml when present, otherwise the packaged defaults."""
    root = resolve_home(home)
    params_file = root / "params.yaml"
    params: dict[str, Any] = {}
    if params_file.exists():
        try:
            params = yaml.safe_load(params_file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{params_file}: not valid YAML ({exc}); fix or delete the file") from exc
        if not isinstance(params, dict):
            raise ConfigError(f"{params_file}: expected a mapping of stage name to parameters")
    return Settings(paths=Paths(root), params=params)


# Default train.time_budget, in reference steps (one LoRA r=16 SFT step of the embedded model at batch
# 4 x 256). Issue 29's first night must fit 300 of them in all. Evaluation grows with every capability
# trained (base, generic and composite each play its 16 test tasks, its adapter too), so the first night
# trains few, and the rest are deferred to the next nights, which train them first (reused adapters cost
# nothing). At 60 (adapters 45, generic LoRA 15) a measured first night on the bundled sample took about
# 179 reference steps (tool_selection, 15 SFT steps) and a catch-up night 248 (policy_adherence, 15 SFT
# steps, which solved 4 of its 16 test tasks; 30 steps solved 11). At 100 the adapters' 75 buy a multi-turn
# capability about 27 SFT steps at its ~2.8 reference steps each. What the ranked walk leaves buys extra
# SFT steps (Budget.max_sft_steps), so a night spends its whole adapters' share.
TRAIN_TIME_BUDGET = 100.0
# Share of train.time_budget that trains the generic-LoRA baseline (SFT on every trained capability's data).
GENERIC_SHARE = 0.25


@dataclass(frozen=True)
class TrainPlanning:
    """params.yaml ``train``: the night's time budget in reference steps and the generic LoRA's share."""

    time_budget: float
    generic: bool
    generic_share: float

    @property
    def adapter_share(self) -> float:
        """The share of ``time_budget`` the per-capability adapters get."""
        return 1.0 - self.generic_share if self.generic else 1.0


def train_planning(settings: Settings) -> TrainPlanning:
    """The train section's ``time_budget``, ``generic`` and ``generic_share``, validated (ConfigError
    naming the key and what to write instead)."""
    params = settings.stage("train")
    where = settings.paths.home / "params.yaml"
    budget = params.get("time_budget", TRAIN_TIME_BUDGET)
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0:
        raise ConfigError(f"{where}: train.time_budget is {budget!r}; write a positive number of reference "
                          f"steps (default {TRAIN_TIME_BUDGET:g})")
    generic = params.get("generic", True)
    if not isinstance(generic, bool):
        raise ConfigError(f"{where}: train.generic is {generic!r}; write true or false")
    share = params.get("generic_share", GENERIC_SHARE)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
        raise ConfigError(f"{where}: train.generic_share is {share!r}; write a fraction of train.time_budget "
                          f"in [0, 1) (default {GENERIC_SHARE})")
    return TrainPlanning(time_budget=float(budget), generic=generic, generic_share=float(share))


# Default train.rehearsal_share: the share of each adapter's SFT rows that are the agent's own logged
# successes (traceops/train/rehearsal.py). Off by default until it is shown to pay: on the bundled retail
# sample a logged prompt is ~2,400 tokens against ~600 for an environment row, so at 0.25 (about 8 logged
# successes beside 24 demonstrations at budget small; continual-learning practice mixes 10-50% replay) the
# batches holding one pad to ~2,450 tokens with gradient checkpointing, and a measured first night's
# tool_selection SFT step took ~23 s against a ~5 s reference step (priced at 0.8 reference steps), which
# alone overran the 300-step night. Its effect on the held-out real requests is not measured yet.
REHEARSAL_SHARE = 0.0


def rehearsal_share(settings: Settings) -> float:
    """params.yaml ``train.rehearsal_share``, validated: a fraction in [0, 1) (0 turns rehearsal off)."""
    share = settings.stage("train").get("rehearsal_share", REHEARSAL_SHARE)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
        raise ConfigError(f"{settings.paths.home / 'params.yaml'}: train.rehearsal_share is {share!r}; write "
                          "the share of each adapter's SFT rows drawn from the agent's logged successes, in "
                          f"[0, 1) (0: none; default {REHEARSAL_SHARE})")
    return float(share)
