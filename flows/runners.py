"""The Prefect task runner is a setting: params.yaml section ``runner``.

    runner:
      kind: thread          # thread (in process, default) | ray (prefect-ray)
      max_workers: 1        # thread: concurrent tasks (1 on a 2-core machine: stages are CPU-bound)
      ray_address: null     # ray: null starts a local Ray cluster; "ray://head:10001" or "auto" joins one
      ray_init: {}          # ray: extra ray.init keyword arguments (num_cpus, runtime_env, ...)

Flows take it with ``some_flow.with_options(task_runner=task_runner(settings))``: mapped tasks
(``task.map``/``task.submit``) then run on the chosen engine; plain task calls stay in the flow's process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from traceops import config
from traceops.errors import ConfigError

KINDS = ("thread", "ray")


@dataclass(frozen=True)
class RunnerParams:
    """Parameters of the ``runner`` section of params.yaml (defaults: one in-process worker)."""

    kind: str = "thread"
    max_workers: int = 1
    ray_address: str | None = None
    ray_init: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> RunnerParams:
        """Validate the section: unknown keys, unknown kinds and non-positive worker counts are errors."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"params.yaml runner: unknown key(s) {unknown}; known: {sorted(known)}")
        params = cls(**{k: v for k, v in values.items() if v is not None})  # null: the default
        if params.kind not in KINDS:
            raise ConfigError(f"params.yaml runner.kind is '{params.kind}'; use one of {list(KINDS)}")
        workers = params.max_workers
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"params.yaml runner.max_workers is {workers!r}; use an integer >= 1")
        if params.ray_address is not None and not isinstance(params.ray_address, str):
            raise ConfigError("params.yaml runner.ray_address must be null, 'auto' or 'ray://host:port'")
        if not isinstance(params.ray_init, Mapping):
            raise ConfigError("params.yaml runner.ray_init must be a mapping of ray.init keyword arguments")
        return params


def runner_params(settings: config.Settings) -> RunnerParams:
    """The validated ``runner`` section of a home's params.yaml."""
    return RunnerParams.from_dict(settings.stage("runner"))


def task_runner(settings: config.Settings) -> Any:
    """The Prefect task runner the home's params.yaml asks for.

    ``thread``: Prefect's ``ThreadPoolTaskRunner(max_workers)``. ``ray``: ``prefect_ray.RayTaskRunner``
    connected to ``ray_address`` (a local cluster is started when it is null). Ray is an optional extra:
    ``pip install 'traceops[ray]'``.
    """
    params = runner_params(settings)
    if params.kind == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=params.max_workers)
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise ConfigError("params.yaml runner.kind is 'ray' but prefect-ray is not installed; "
                          "run `pip install 'traceops[ray]'` or set runner.kind: thread") from exc
    # The local cluster's dashboard is a web server nobody asked for; a remote cluster keeps its own.
    init = {"include_dashboard": False, **dict(params.ray_init)} if params.ray_address is None \
        else dict(params.ray_init)
    init["runtime_env"] = _with_worker_env(dict(init.get("runtime_env") or {}))
    return RayTaskRunner(address=params.ray_address, init_kwargs=init)


def _with_worker_env(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """Ray's runtime_env plus this process's Prefect and traceops settings, so that every Ray worker
    talks to the same Prefect home / API and the same traceops home; a worker that must start an
    ephemeral Prefect server on a busy machine gets the same generous start-up timeout as the flow."""
    import os

    inherited = {k: v for k, v in os.environ.items() if k.startswith(("PREFECT_", "TRACEOPS_"))}
    inherited.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if "PREFECT_API_URL" not in inherited:
        # In-process runs use Prefect's ephemeral API server. Point the workers at the one this process
        # already runs rather than letting each start its own on the same database (slow, and on a busy
        # machine it times out). Prefect keeps it as the port-less instance of SubprocessASGIServer.
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer._instances.get(None)
        if server is not None and server.running:
            inherited["PREFECT_API_URL"] = server.api_url
    env_vars = {**inherited, **dict(runtime_env.get("env_vars") or {})}  # the user's values win
    return {**runtime_env, "env_vars": env_vars}
