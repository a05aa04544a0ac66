"""Keep-base routing examples: which of the base model's logged requests tell the router when the base
should answer.

A composite's adapters learn their capability and can lose what the base already did right: on the BFCL
night the tool_selection adapter called a near-topic tool on 15 of the 16 held-out requests no tool
serves, which the base had declined (16/83 held-out requests right for the base, 16/83 for the
composite). Whether a request is one of those is readable from the prompt: a logistic probe on the base
model's prompt-mean hidden states, fitted on 317 train-side logged requests, told the base's successes
from its failures on 93-96% of the held-out ones.

So the route stage may also fit the request-mode decision on the base model's own logged requests:

* Only runs logged by the base model itself (``Trajectory.agent`` is its id): another agent's successes
  say nothing of what the base does.
* Only the train side of the held-out split (``traceops.heldout``, the ``evaluate.requests`` seed and
  fraction), one run per task (``train.rehearsal.eligible_trajectories``).
* A succeeded run targets the null expert (the base answers); a failed one the expert of the capability
  the diagnosis blamed for it (``attributions.parquet``), when the composite has that expert; other
  failures are left out.
* Up to ``per_target`` runs per target, in the order of a seeded hash of the run id (stable as logs
  grow).
* Each run is rendered through the serving path up to its request turn's reply
  (``train.rehearsal.served_conversation``): its decision prompt is exactly the prompt served.

Pure: the caller loads the trajectories and the attributions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from traceops.hashing import content_hash
from traceops.moe.config import NULL_EXPERT
from traceops.schema import Trajectory
from traceops.train.rehearsal import eligible_trajectories, served_conversation


@dataclass(frozen=True)
class KeepBaseDraw:
    """The logged runs drawn for keep-base routing: ``ids`` by target (a capability, or ``NULL_EXPERT``:
    the base), and how many were eligible per target (``available``)."""

    ids: dict[str, list[str]] = field(default_factory=dict)
    available: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """A cache-key part naming the draw (the runs' ids are content hashes: an edited log changes it)."""
        return content_hash({"ids": self.ids})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def draw_keep_base(trajectories: Iterable[Trajectory], blamed: Mapping[str, str | None],
                   capabilities: Iterable[str], agent: str, seed: int, fraction: float, per_target: int,
                   draw_seed: int = 0) -> KeepBaseDraw:
    """The runs of ``agent`` that teach keep-base routing (module docstring). ``blamed`` maps a failed
    run's id to the capability the diagnosis blamed (None: none); ``seed`` and ``fraction`` are the
    held-out split's; ``draw_seed`` orders each target's runs."""
    experts = set(capabilities)
    mine = [t for t in trajectories if t.agent == agent]
    pools: dict[str, list[Trajectory]] = {}
    for trajectory in eligible_trajectories(mine, seed, fraction, succeeded=False):
        target = NULL_EXPERT if trajectory.outcome.succeeded else blamed.get(trajectory.id)
        if target == NULL_EXPERT or target in experts:
            pools.setdefault(str(target), []).append(trajectory)
    ids: dict[str, list[str]] = {}
    for target, pool in sorted(pools.items()):
        ordered = sorted(pool, key=lambda t: (content_hash({"seed": draw_seed, "id": t.id}), t.id))
        ids[target] = [t.id for t in ordered[:per_target]]
    return KeepBaseDraw(ids=ids, available={target: len(pool) for target, pool in sorted(pools.items())})


def decision_row(trajectory: Trajectory) -> dict[str, Any]:
    """A logged run as a routing example (``{"messages", "tools"}``, tools as a JSON string): its served
    conversation up to the request turn's reply."""
    conversation, tools, end = served_conversation(trajectory)
    return {"messages": conversation[:end], "tools": json.dumps(tools)}


def keep_base_examples(draw: KeepBaseDraw,
                       trajectories: Sequence[Trajectory]) -> dict[str, list[dict[str, Any]]]:
    """The drawn runs as routing examples by target, in draw order; raises KeyError naming a drawn run
    missing from ``trajectories``."""
    found = {t.id: t for t in trajectories}
    missing = [i for ids in draw.ids.values() for i in ids if i not in found]
    if missing:
        raise KeyError(f"drawn runs {missing[:3]} are not among the trajectories given")
    return {target: [decision_row(found[i]) for i in ids] for target, ids in draw.ids.items()}
