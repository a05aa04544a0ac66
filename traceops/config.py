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
