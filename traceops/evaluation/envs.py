"""Run a model on the held-out split of synthesized environments: success, mean reward and pass^k.

An environments root holds one folder per capability (``data/environments/<capability>/``) with
``manifest.json`` and one JSONL file of task specs per split (``<split>.jsonl`` or
``tasks/<split>.jsonl``). The environment class comes from the manifest's ``environment`` import path
when it has one, else from the built-in family of the capability.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from traceops.envs.base import Environment
from traceops.envs.families import UnknownCapabilityError
from traceops.envs.folder import (
    MANIFEST_NAME,
    environment_capabilities,
    manifest_environment,
    read_manifest,
    read_task_specs,
    split_path,
)
from traceops.errors import ConfigError, InputError
from traceops.evaluation.metrics import CapabilityEval, EnvEval
from traceops.evaluation.room import room_for
from traceops.hashing import content_hash
from traceops.model.base import ChatModel, GenerationConfig
from traceops.model.toolcalls import assistant_text

# Trial t samples under seed + t * stride: far apart, so trial seeds never meet the per-batch offsets
# a backend adds to the seed.
TRIAL_SEED_STRIDE = 100_003


def list_capabilities(env_root: str | Path) -> list[str]:
    """The capability folders under ``env_root`` (``environment_capabilities``); a missing root is a
    ConfigError here, since evaluation has nothing to score without it."""
    root = Path(env_root)
    if not root.is_dir():
        raise ConfigError(f"environments folder {root} does not exist; run `traceops synthesize` first")
    return environment_capabilities(root)


def env_factory(env_root: str | Path, capability: str) -> Callable[[], Environment]:
    """A factory of fresh environments for one capability folder (manifest import path, else family)."""
    folder = Path(env_root) / capability
    manifest = read_manifest(folder, f"run `traceops synthesize` for '{capability}'")
    return manifest_environment(manifest if isinstance(manifest, dict) else {},
                                str(folder / MANIFEST_NAME), capability)


def load_tasks(
    env_root: str | Path, capability: str, split: str, limit: int | None = None
) -> list[dict[str, Any]]:
    """The task specs of one split, in file order, at most ``limit``; each gets a ``task_id``."""
    folder = Path(env_root) / capability
    path = split_path(folder, split)
    if path is None:
        raise ConfigError(f"{folder}: no '{split}' split ({split}.jsonl); run `traceops synthesize` first")
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, task in read_task_specs(path):
        task.setdefault("task_id", content_hash(task))
        if str(task["task_id"]) in seen:
            raise InputError(
                f"duplicate task_id {task['task_id']!r}; regenerate the split",
                file=str(path),
                record=number,
                field="task_id",
            )
        seen.add(str(task["task_id"]))
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def oracle_replies(factory: Callable[[], Environment], tasks: Sequence[dict[str, Any]]) -> list[str]:
    """Every assistant turn of the tasks' oracle demonstrations, as the model would write it; none for
    an environment whose oracle fails (a user's class may not define one)."""
    env = factory()
    texts: list[str] = []
    for task in tasks:
        try:
            env.reset(**task)
            turns = env.oracle()
        except Exception:  # an oracle is optional for scoring: without one the per-turn cap stands
            return []
        texts.extend(assistant_text(t.content, [(c.name, dict(c.arguments)) for c in t.calls]) for t in turns)
    return texts


def evaluate_envs(
    model: ChatModel,
    env_root: str | Path,
    capabilities: Sequence[str] | None = None,
    split: str = "test",
    k: int = 1,
    max_turns: int = 8,
    config: GenerationConfig | None = None,
    limit: int | None = None,
    trials: int | None = None,
    batch_size: int = 8,
    progress: Callable[[str, int], None] | None = None,
) -> EnvEval:
    """Run ``model`` on ``split`` of each capability's environments, ``trials`` times (default ``k``),
    each turn with room for the capability's longest oracle turn (``traceops.evaluation.room``;
    ``config.max_new_tokens`` at least).

    Trial ``t`` samples under ``config.seed + t * TRIAL_SEED_STRIDE``, so with temperature > 0 trials
    are i.i.d. draws; with greedy decoding and a deterministic backend they repeat each other and
    pass^k equals the success rate. A capability that cannot be evaluated (no folder, no family, an
    empty split) is listed in ``skipped`` with the reason, never scored as 0. ``progress(capability,
    episodes_done)`` is called as episodes finish.
    """
    from traceops.agent import run_episodes

    n_trials = k if trials is None else trials
    if k < 1 or n_trials < k:
        raise ConfigError(f"evaluate: need k >= 1 and trials >= k, got k={k}, trials={n_trials}")
    if limit is not None and limit < 1:
        raise ConfigError(f"evaluate: limit must be at least 1 (or None for the whole split), got {limit}")
    config = config or GenerationConfig()
    chosen = list_capabilities(env_root) if capabilities is None else list(dict.fromkeys(capabilities))
    results: dict[str, CapabilityEval] = {}
    skipped: dict[str, str] = {}
    for capability in chosen:
        try:
            factory = env_factory(env_root, capability)
            tasks = load_tasks(env_root, capability, split, limit)
        except (ConfigError, UnknownCapabilityError) as exc:
            skipped[capability] = str(exc)
            continue
        if not tasks:
            skipped[capability] = f"the '{split}' split of '{capability}' is empty"
            continue
        ids = [str(t["task_id"]) for t in tasks]
        room = room_for(model, oracle_replies(factory, tasks), config.max_new_tokens)
        rewards: dict[str, list[float]] = {i: [] for i in ids}
        done = 0
        for trial in range(n_trials):
            trial_config = replace(config, seed=config.seed + trial * TRIAL_SEED_STRIDE, max_new_tokens=room)
            on_done = None
            if progress is not None:

                def on_done(count: int, _base: int = done, _cap: str = capability) -> None:
                    progress(_cap, _base + count)

            trajectories = run_episodes(
                model,
                factory,
                tasks,
                max_turns=max_turns,
                config=trial_config,
                batch_size=batch_size,
                domain=f"env:{capability}",
                progress=on_done,
            )
            for task_id, trajectory in zip(ids, trajectories, strict=True):
                rewards[task_id].append(float(trajectory.outcome.reward or 0.0))
            done += len(tasks)
        results[capability] = CapabilityEval(capability=capability, rewards=rewards, k=k)
    return EnvEval(
        model_id=model.info.model_id,
        split=split,
        k=k,
        trials=n_trials,
        temperature=float(config.temperature),
        seed=int(config.seed),
        capabilities=results,
        skipped=skipped,
    )
