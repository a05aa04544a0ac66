"""The built-in environment families, one per capability (DESIGN.md: Capability ids)."""

from __future__ import annotations

from traceops.envs.families.argument_grounding import ArgumentGroundingFamily
from traceops.envs.families.error_recovery import ErrorRecoveryFamily
from traceops.envs.families.irrelevance_refusal import IrrelevanceRefusalFamily
from traceops.envs.families.multi_step_transaction import MultiStepTransactionFamily
from traceops.envs.families.policy_adherence import PolicyAdherenceFamily
from traceops.envs.families.state_tracking import StateTrackingFamily
from traceops.envs.families.tool_call_format import ToolCallFormatFamily
from traceops.envs.families.tool_selection import ToolSelectionFamily
from traceops.envs.family import Family
from traceops.errors import TraceopsError

FAMILIES: dict[str, Family] = {
    family.capability: family
    for family in (
        ToolCallFormatFamily(),
        ToolSelectionFamily(),
        ArgumentGroundingFamily(),
        MultiStepTransactionFamily(),
        StateTrackingFamily(),
        ErrorRecoveryFamily(),
        PolicyAdherenceFamily(),
        IrrelevanceRefusalFamily(),
    )
}


class UnknownCapabilityError(TraceopsError):
    """No environment family covers the capability."""


def get_family(capability: str) -> Family:
    """The family for ``capability``; a clear error when none covers it (report the gap, don't drop it)."""
    family = FAMILIES.get(capability)
    if family is None:
        raise UnknownCapabilityError(
            f"no environment family covers capability '{capability}'; families exist for: "
            f"{', '.join(sorted(FAMILIES))}. Report it as an uncovered gap or add a family under "
            f"traceops/envs/families/"
        )
    return family


__all__ = ["FAMILIES", "Family", "UnknownCapabilityError", "get_family"]
