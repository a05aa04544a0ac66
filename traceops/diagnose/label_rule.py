"""The rule labeler: capability labels straight from detector hits.

LACKING when an unexplained hit at or above ``min_severity`` points at the capability; PRESENT when
the capability was exercised without such a hit; NA when it was not exercised. "Exercised" means:

- tool_call_format: the agent made any call (structured, ``<tool_call>`` text or bash block);
- tool_selection: a non-bash call, or an in-scope request, while the tool list is known;
- argument_grounding: a non-bash call with at least one argument;
- multi_step_transaction: the user asked for an action (cancel/return/...) and a write tool exists;
- state_tracking: two or more calls, or a final answer after tool output;
- error_recovery: a tool error or a command error was observed;
- policy_adherence: the agent called a write tool;
- irrelevance_refusal: the request is out of the tools' scope.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from traceops.diagnose import heuristics as h
from traceops.diagnose.labels import Analyzed, CapabilityLabel, LabelSet, LabelValue
from traceops.diagnose.view import TraceView


def exercised(view: TraceView) -> set[str]:
    """The built-in capabilities a trajectory exercises (see the module docstring)."""
    calls = view.calls
    api = [c for c in calls if c.source != "bash"]
    caps: set[str] = set()
    if calls:
        caps.add("tool_call_format")
    if (api or h.out_of_scope(view) is False) and view.trajectory.tools and not view.bash_style:
        caps.add("tool_selection")
    if any(c.arguments or c.malformed for c in api):
        caps.add("argument_grounding")
    if h.write_requested(view) and any(view.is_write(t) for t in view.tool_names):
        caps.add("multi_step_transaction")
    final = view.final_answer_step()
    if len(calls) >= 2 or (final is not None and any(m.role == "tool" for m in view.messages[:final])):
        caps.add("state_tracking")
    if any(h.is_tool_error(c.result) or h.command_error(c.result) for c in calls):
        caps.add("error_recovery")
    if any(view.is_write(c.name) for c in api):
        caps.add("policy_adherence")
    if h.out_of_scope(view):
        caps.add("irrelevance_refusal")
    return caps


@dataclass
class RuleLabeler:
    """Deterministic labels from detector hits; symptom hits explained by a root cause are ignored."""

    min_severity: float = 0.5
    count_explained: bool = False
    name: str = "rule"

    def label_one(self, item: Analyzed, capabilities: list[str]) -> dict[str, CapabilityLabel]:
        """Labels of one trajectory."""
        active = exercised(item.view)
        hits = [
            x
            for x in item.hits
            if x.severity >= self.min_severity and (self.count_explained or x.explained_by is None)
        ]
        row: dict[str, CapabilityLabel] = {}
        for cap in capabilities:
            mine = [x for x in hits if x.capability == cap]
            if mine:
                first = mine[0]
                row[cap] = CapabilityLabel(
                    LabelValue.LACKING,
                    first.step,
                    max(x.severity for x in mine),
                    f"{first.detector}@{first.step}: {first.evidence}",
                )
            elif cap in active:
                row[cap] = CapabilityLabel(LabelValue.PRESENT)
            else:
                row[cap] = CapabilityLabel(LabelValue.NA)
        return row

    def label(self, items: list[Analyzed], capabilities: list[str]) -> LabelSet:
        """Label every item; one run (the labeler is deterministic)."""
        start = time.perf_counter()
        run = {item.trajectory.id: self.label_one(item, capabilities) for item in items}
        return LabelSet(
            self.name, [run], deterministic=True, cost={"seconds": time.perf_counter() - start, "tokens": 0.0}
        )
