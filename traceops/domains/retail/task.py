"""The retail task: what the user wants, what they know, and the gold dialogue that satisfies it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traceops.envs.base import AssistantTurn, Call

# Task kinds grouped by what they exercise; the planted-gap agent uses these to know where a
# failure type applies.
LOOKUP_KINDS = ("order_status", "order_total", "product_price")
WRITE_KINDS = ("cancel_order", "modify_order_address", "update_address", "transfer_human")
MULTI_STEP_KINDS = ("return_items", "exchange_item", "cancel_two_orders")
POLICY_KINDS = ("refuse_cancel_delivered", "refuse_late_return", "refuse_modify_processed")
ERROR_KINDS = ("recover_order_id", "recover_email", "recover_out_of_stock")
OUT_OF_SCOPE_KINDS = ("out_of_scope",)
KINDS = LOOKUP_KINDS + WRITE_KINDS + MULTI_STEP_KINDS + POLICY_KINDS + ERROR_KINDS + OUT_OF_SCOPE_KINDS

WRITE_TOOLS = frozenset({
    "cancel_pending_order", "modify_pending_order_address", "update_user_address",
    "return_delivered_order_items", "exchange_delivered_order_items", "transfer_to_human_agents",
})


@dataclass(frozen=True)
class Task:
    """One retail task.

    ``turns`` is the gold dialogue (assistant side); its calls in order are the gold actions whose
    replay defines the expected database. ``outputs`` must appear in the assistant's messages.
    ``facts`` are what the scripted user answers when asked (keyed by cue, see ``user.py``).
    ``forbidden`` is the write a policy task's user asks for and the policy forbids; ``error_turn``
    is the index in ``turns`` of the gold call that returns an error (error-recovery tasks).
    ``no_tools`` marks out-of-scope requests where calling any tool is a failure.
    """

    id: str
    kind: str
    instruction: str
    facts: dict[str, str] = field(default_factory=dict)
    turns: tuple[AssistantTurn, ...] = ()
    outputs: tuple[str, ...] = ()
    forbidden: Call | None = None
    error_turn: int | None = None
    no_tools: bool = False

    @property
    def actions(self) -> tuple[Call, ...]:
        """The gold action sequence: every call of the gold dialogue, in order."""
        return tuple(call for turn in self.turns for call in turn.calls)

    def spec(self) -> dict[str, Any]:
        """The keyword arguments of ``RetailEnv.reset`` for this task."""
        return {"task_id": self.id}
