"""The built-in capability ids (DESIGN.md, Contracts) with one-line descriptions.

Environment families use the same ids. ``PROTOTYPES`` are short failure descriptions the embedding
labeler compares log segments against.
"""

from __future__ import annotations

CAPABILITIES: dict[str, str] = {
    "tool_call_format": "Emits well-formed tool calls: parseable JSON, required arguments, right types.",
    "tool_selection": "Chooses a tool that exists and fits the request.",
    "argument_grounding": "Fills arguments with values from the user or earlier tool outputs, not invented.",
    "multi_step_transaction": "Carries a multi-step task through to the required write actions.",
    "state_tracking": "Tracks what tools returned: no redundant calls, no claims the outputs do not support.",
    "error_recovery": "Reacts to a tool or command error by changing course, not repeating or giving up.",
    "policy_adherence": "Follows the domain policy, e.g. asks for explicit confirmation before a write.",
    "irrelevance_refusal": "Declines to call tools when the request is outside what the tools can do.",
}

PROTOTYPES: dict[str, tuple[str, ...]] = {
    "tool_call_format": (
        "the tool call is malformed invalid JSON that cannot be parsed",
        "missing required argument or argument has the wrong type in the function call",
    ),
    "tool_selection": (
        "called a tool that does not exist unknown function name",
        "picked the wrong tool for the request",
    ),
    "argument_grounding": (
        "used an order id or email that the user never gave and no tool returned, a hallucinated identifier",
        "argument value is invented and not found in the conversation",
    ),
    "multi_step_transaction": (
        "the user asked to cancel return or exchange but the agent ended without performing the action",
        "stopped before completing the required write steps of the task",
    ),
    "state_tracking": (
        "repeated the same tool call again with identical arguments",
        "final answer states numbers or ids that no tool output contains",
    ),
    "error_recovery": (
        "the tool returned an error and the agent repeated the same failing call or gave up",
        "command failed with traceback non-zero exit code or command not found",
    ),
    "policy_adherence": (
        "performed a database write without asking the user for explicit confirmation",
        "violated the domain policy",
    ),
    "irrelevance_refusal": (
        "called a tool although the request is outside the scope of the available tools",
        "should have declined instead of calling a function",
    ),
}

BUILTIN: tuple[str, ...] = tuple(CAPABILITIES)
