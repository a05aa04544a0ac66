"""Environments: the Environment contract, the families (one per capability), grounding, verifiers,
self-tests, calibration and exports. Import submodules directly; this module names the entry points."""

from __future__ import annotations

from traceops.envs.base import AssistantTurn, Call, Environment, not_a_tool, play
from traceops.envs.families import FAMILIES, UnknownCapabilityError, get_family
from traceops.envs.family import Family, load_task
from traceops.envs.grounding import Grounding, build_grounding, select_seeds

__all__ = [
    "FAMILIES",
    "AssistantTurn",
    "Call",
    "Environment",
    "Family",
    "Grounding",
    "UnknownCapabilityError",
    "build_grounding",
    "get_family",
    "load_task",
    "not_a_tool",
    "play",
    "select_seeds",
]
