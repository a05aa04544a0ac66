"""The family contract: ``(seed, grounding)`` -> task specs (plain JSON-able dicts) -> environments.

A family generates instances level by level (a curriculum: level 1 is the easiest). Every instance is
seeded by ``(seed, capability, index)`` alone, so the same seed always gives the same tasks, and its
``task_id`` is the content hash of the spec. Task specs travel as dataset rows: ``load_task`` accepts
either the spec's own fields or one ``task_json`` column, and ignores TRL's ``prompt`` column.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from traceops.envs.base import AssistantTurn, Call, Environment
from traceops.envs.grounding import Grounding, ValueFactory, exclusion_set
from traceops.errors import TraceopsError

TASK_COLUMN = "task_json"
REQUIRED_FIELDS = ("capability", "level", "instruction")


class TaskError(TraceopsError):
    """A task spec is malformed or belongs to another family."""


def load_task(task: Mapping[str, Any], capability: str) -> dict[str, Any]:
    """The task spec inside ``reset`` kwargs: the ``task_json`` column when present, else the fields."""
    if TASK_COLUMN in task:
        raw = task[TASK_COLUMN]
        try:
            spec = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise TaskError(
                f"reset(): column '{TASK_COLUMN}' is not a JSON object ({exc}); "
                f"export tasks with traceops.envs.export.to_dataset"
            ) from exc
    else:
        spec = {k: v for k, v in task.items() if k != "prompt"}
    missing = [name for name in REQUIRED_FIELDS if name not in spec]
    if missing:
        raise TaskError(
            f"task {spec.get('task_id', '?')}: missing field(s) {missing}; pass a task spec made "
            f"by the '{capability}' family"
        )
    if spec["capability"] != capability:
        raise TaskError(
            f"task {spec.get('task_id', '?')} is for capability '{spec['capability']}', but this "
            f"environment serves '{capability}'"
        )
    return spec


def task_id(spec: Mapping[str, Any]) -> str:
    """Hash of the sorted JSON of a spec without its id (specs hold only JSON values we generated)."""
    body = {k: v for k, v in spec.items() if k != "task_id"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def oracle_turns(calls: Sequence[Mapping[str, Any]], final: str) -> list[AssistantTurn]:
    """One assistant turn per gold call, then a final text turn."""
    turns = [AssistantTurn(calls=(Call(c["name"], dict(c["arguments"])),)) for c in calls]
    return turns + [AssistantTurn(content=final)]


class Family:
    """Generates task specs for one capability and makes its environment."""

    capability: ClassVar[str] = ""
    env_class: ClassVar[type[Environment]] = Environment
    levels: ClassVar[tuple[int, ...]] = (1, 2, 3)
    description: ClassVar[str] = ""

    def make_env(self) -> Environment:
        """A fresh environment instance (TRL's ``environment_factory`` shape: no arguments)."""
        return self.env_class()

    def generate(
        self,
        grounding: Grounding,
        seed: int,
        n: int,
        *,
        levels: Sequence[int] | None = None,
        exclude: Sequence[str] = (),
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """``n`` task specs cycling through ``levels``; instance ``i`` depends only on (seed, i)."""
        chosen = tuple(levels) if levels else self.levels
        unknown = [lvl for lvl in chosen if lvl not in self.levels]
        if unknown:
            raise TaskError(f"family '{self.capability}' has levels {list(self.levels)}; got {unknown}")
        excluded = exclusion_set(grounding, exclude)
        tasks = []
        for index in range(offset, offset + n):
            rng = random.Random(f"{seed}:{self.capability}:{index}")
            level = chosen[index % len(chosen)]
            values = ValueFactory(grounding, rng, excluded)
            spec = self.make_task(rng, values, grounding, level)
            spec.update(capability=self.capability, level=level)
            spec["task_id"] = task_id(spec)
            tasks.append(spec)
        return tasks

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        """One task spec (without capability, level and task_id, which ``generate`` adds)."""
        raise TypeError(f"{type(self).__name__} must define make_task")

    def uses_defaults(self, grounding: Grounding) -> bool:
        """True when this family falls back on built-in tools for ``grounding``."""
        return grounding.source == "default"


def opening(rng: random.Random, grounding: Grounding) -> str:
    """A user's opening line taken from the logs' (sanitized) phrasing, or empty when none was kept."""
    return f"{rng.choice(grounding.phrasings)} " if grounding.phrasings else ""
