"""Bundled operating domains: a registry of name -> ``Domain`` (tasks, environment factory, policy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from traceops.envs.base import Environment
from traceops.errors import ConfigError


@dataclass(frozen=True)
class Domain:
    """One operating domain: its policy, its generated tasks and a factory of fresh environments."""

    name: str
    policy: str
    seed: int
    default_count: int
    _tasks: Callable[[int, int | None], list[Any]]
    _get_task: Callable[[int, str], Any]
    _make_env: Callable[[int], Environment]

    def tasks(self, count: int | None = None) -> list[Any]:
        """The first ``count`` tasks (``default_count`` when None); each has ``id``, ``kind``, ``spec()``."""
        return self._tasks(self.seed, self.default_count if count is None else count)

    def task(self, task_id: str) -> Any:
        """One task by id; ConfigError naming the valid ids when there is none."""
        return self._get_task(self.seed, task_id)

    def make_env(self) -> Environment:
        """A fresh environment; start an episode with ``env.reset(**task.spec())``."""
        return self._make_env(self.seed)


def _retail(seed: int) -> Domain:
    from traceops.domains.retail import POLICY, RetailEnv, generate_tasks, get_task
    from traceops.domains.retail.tasks import DEFAULT_COUNT

    return Domain(name="retail", policy=POLICY, seed=seed, default_count=DEFAULT_COUNT,
                  _tasks=generate_tasks, _get_task=get_task, _make_env=RetailEnv)


DOMAINS: dict[str, Callable[[int], Domain]] = {"retail": _retail}


def domain_names() -> list[str]:
    """Names of the bundled domains."""
    return sorted(DOMAINS)


def get_domain(name: str, seed: int = 0) -> Domain:
    """The bundled domain ``name`` with its database generated from ``seed``."""
    if name not in DOMAINS:
        raise ConfigError(f"unknown domain {name!r}; valid domains: {', '.join(domain_names())}")
    return DOMAINS[name](seed)


def replay_fn(trajectory: Any, step: int) -> float | None:
    """Counterfactual reward of ``trajectory`` with the gold continuation from ``step`` (see
    ``traceops.domains.<name>.replay``); None when its domain has no replay or the task is unknown."""
    if getattr(trajectory, "domain", None) == "retail":
        from traceops.domains.retail.replay import replay

        return replay(trajectory, step)
    return None
