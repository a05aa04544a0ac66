"""tool_selection: pick the right API from a catalog with distractors, from a description of intent.

The request paraphrases the target's description (never its name) and states the argument values.
Level 1: 2 APIs; level 2: 4; level 3: 8, including near-miss variants of the target (same arguments,
another verb) listed before it.

Native tasks (``traceops.envs.native.selection_task``) offer the logged tools (1 or 2, 4, then up to 8,
never more than one logged request offered; distractors drawn from the same logs only) and state the
values in prose, optional ones included at times; some ask one tool for several cases, some ask what no
offered tool does (no call is right).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from traceops.envs.apis import (
    ApiCallEnv,
    api_view,
    catalog_text,
    distractor_apis,
    gold_arguments,
    render_value,
)
from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.native import selection_task

CATALOG_SIZE = {1: 2, 2: 4, 3: 8}


def intent(api: dict[str, Any]) -> str:
    """What the API does, in words: its description, else its name spelled out."""
    text = (api.get("description") or api["name"].replace("_", " ")).strip().rstrip(".")
    return text[0].lower() + text[1:] if text else api["name"]


class ToolSelectionEnv(ApiCallEnv):
    """Several APIs in the catalog; only the one matching the intent is right."""

    capability: ClassVar[str] = "tool_selection"


class ToolSelectionFamily(Family):
    """Curriculum over catalog size and how close the distractors are."""

    capability: ClassVar[str] = "tool_selection"
    env_class: ClassVar[type[ApiCallEnv]] = ToolSelectionEnv
    description: ClassVar[str] = "Choose the API that serves the request among similar ones."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        size = CATALOG_SIZE[min(level, 3)]
        if grounding.interface == "native":
            # No longer menus than the agent's own requests show: an 8-tool menu where the logs offer 1
            # to 4 functions (BFCL) only lengthens every row it is in, and so every step of its batch.
            offered = min(size, grounding.max_menu) if grounding.max_menu > 0 else size
            return selection_task(rng, values, grounding, level=level, offered=offered)
        target = api_view(rng.choice(list(grounding.tools)))
        distractors = distractor_apis(grounding, target, rng, size - 1)
        if level >= 3:
            near = [d for d in distractors if d["args"] == target["args"]]
            far = [d for d in distractors if d["args"] != target["args"]]
            rng.shuffle(far)
            catalog = near + [target] + far
        else:
            catalog = [target, *distractors]
            rng.shuffle(catalog)
        arguments = gold_arguments(target, values, grounding, all_args=False)
        listed = ", ".join(f"{k} {render_value(v)}" for k, v in sorted(arguments.items()))
        request = f"{opening(rng, grounding)}I need you to {intent(target)}. Use {listed}."
        return {
            "apis": catalog,
            "gold": {"name": target["name"], "arguments": arguments},
            "instruction": f"{catalog_text(catalog)}\n\nUser: {request}",
            "partial_credit": True,
        }
