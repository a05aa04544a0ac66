"""Process set-up shared by every flow: the home's Prefect state, MLflow store and the home lock.

Prefect reads ``PREFECT_HOME`` when it is imported, so ``prepare`` must run before any
``import prefect``: the CLI calls it first, and flows import Prefect lazily after it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from traceops import config, registry
from traceops.errors import ConfigError
from traceops.versioning import ensure_repo


def prepare(home: str | Path | None = None) -> config.Settings:
    """Resolve the home, point Prefect and MLflow at it, and initialize git + DVC there if needed."""
    settings = config.load(home)
    paths = settings.paths
    paths.home.mkdir(parents=True, exist_ok=True)
    os.environ["TRACEOPS_HOME"] = str(paths.home)
    os.environ.setdefault("PREFECT_HOME", str(paths.prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    for noisy in ("mlflow", "alembic", "great_expectations", "dvc", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Set up git + DVC only while holding the home's lock: two runs started together on a fresh home
    # must not both `dvc init` (the loser crashed with InitError), and no run may rewrite DVC's config
    # while another one works. A run that holds the lock has set the home up already.
    try:
        with FileLock(str(paths.lock)).acquire(timeout=0):
            ensure_repo(paths.home)
    except Timeout:
        pass
    registry.configure(paths)
    return settings


@contextmanager
def home_lock(settings: config.Settings, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the home's lock for a run; a second run waits ``wait_s`` seconds, then refuses clearly."""
    lock = FileLock(str(settings.paths.lock))
    try:
        lock.acquire(timeout=wait_s)
    except Timeout as exc:
        raise ConfigError(
            f"another traceops run holds {settings.paths.lock}; wait for it to finish "
            "(or pass --wait SECONDS), then run again"
        ) from exc
    try:
        # Under the lock no other traceops process is live, so a RUNNING run was left by a killed one.
        registry.kill_running_runs(settings.paths)
        yield
    finally:
        lock.release()
