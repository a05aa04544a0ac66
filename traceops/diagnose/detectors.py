"""Deterministic per-step detectors over any trajectory (tool-calling or bash-in-text agents).

Each detector reads a ``TraceView`` and returns ``Hit``s. ``severity`` in [0, 1] says how clearly the
hit is a failure (a command error the agent reacted to is 0.3: seen, but recovered); the rule labeler
only counts hits at or above its ``min_severity``. ``PRIOR`` is each detector's prior confidence that a
hit is a root cause rather than a downstream symptom: attribution multiplies it with severity.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date
from typing import Any

from traceops.diagnose import heuristics as h
from traceops.diagnose.jsonschema_check import violations
from traceops.diagnose.view import CallView, TraceView, build_view
from traceops.schema import Trajectory


@dataclass(frozen=True)
class Hit:
    """One detector firing at one step, with the capability it points to."""

    detector: str
    step: int
    capability: str
    evidence: str
    severity: float
    cause_step: int | None = None  # the earlier step this hit reacts to (the failing call of an error)
    explained_by: str | None = None  # "detector@step" of the root cause this hit is a symptom of


def _clip(text: str | None, n: int = 160) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def malformed_call(v: TraceView) -> list[Hit]:
    """A call whose arguments do not parse, a broken ``<tool_call>``, or a bash turn with many blocks."""
    return [
        Hit("malformed_call", c.step, "tool_call_format", f"{c.name}: {c.malformed}", 0.9)
        for c in v.calls
        if c.malformed
    ]


def unknown_tool(v: TraceView) -> list[Hit]:
    """A call to a tool missing from ``trajectory.tools`` (only when tools are known)."""
    if not v.trajectory.tools:
        return []
    names = v.tool_names
    return [
        Hit(
            "unknown_tool",
            c.step,
            "tool_selection",
            f"called '{c.name}', not among {len(names)} tools: {', '.join(sorted(names)[:8])}",
            0.9,
        )
        for c in v.calls
        if c.source != "bash" and not c.malformed and c.name not in names
    ]


def _fitting_tools(arguments: dict[str, Any], specs: dict[str, Any], exclude: str) -> list[str]:
    """Other tools whose schema the arguments satisfy and that take every argument given."""
    out = []
    for name, schema in specs.items():
        props = (schema or {}).get("properties") or {}
        fits = arguments and set(arguments) <= set(props) and not violations(arguments, schema)
        if name != exclude and fits:
            out.append(name)
    return sorted(out)


def schema_violation(v: TraceView) -> list[Hit]:
    """Arguments breaking the tool's JSON schema: required, types, enums, unexpected names.

    When the same arguments fit another tool's schema exactly, the call is the wrong tool with the
    right arguments (``wrong_tool``, tool_selection) rather than a malformed call.
    """
    specs = {t.name: t.parameters for t in v.trajectory.tools}
    hits = []
    for c in v.calls:
        if c.malformed or c.name not in specs:
            continue
        problems = violations(c.arguments, specs[c.name])
        if not problems:
            continue
        fitting = _fitting_tools(c.arguments, specs, c.name)
        if fitting:
            hits.append(
                Hit(
                    "wrong_tool",
                    c.step,
                    "tool_selection",
                    f"{c.name}: {'; '.join(problems[:2])}; the arguments fit {', '.join(fitting[:3])}",
                    0.85,
                )
            )
        else:
            hits.append(
                Hit(
                    "schema_violation",
                    c.step,
                    "tool_call_format",
                    f"{c.name}: {'; '.join(problems[:3])}",
                    0.8,
                )
            )
    return hits


def ungrounded_argument(v: TraceView) -> list[Hit]:
    """An id/email/number argument found in no earlier system, user or tool message (nor the tool's enum)."""
    hits = []
    specs = {t.name: t.parameters for t in v.trajectory.tools}
    prefixes = h.Prefixes(v.messages)
    for c in v.calls:
        if c.malformed or c.source == "bash":
            continue
        ctx = prefixes.before(c.step)
        enum_values = {
            str(e)
            for p in ((specs.get(c.name) or {}).get("properties") or {}).values()
            if isinstance(p, dict)
            for e in p.get("enum", [])
        }
        # A value the tool's own error quotes without saying it refers to nothing (out of stock, wrong
        # state) exists: the call was refused for another reason, which error_recovery judges.
        recognised = h.is_tool_error(c.result) and not h.not_found_error(c.result)
        missing = [
            val
            for val in h.checkable_values(c.arguments)
            if str(val) not in enum_values
            and not h.grounded(val, ctx)
            and not (recognised and str(val) in (c.result or ""))
        ]
        if missing:
            hits.append(
                Hit(
                    "ungrounded_argument",
                    c.step,
                    "argument_grounding",
                    f"{c.name}: {', '.join(repr(m) for m in missing[:4])} not in any earlier message",
                    0.8,
                )
            )
    return hits


def _next_call(v: TraceView, call: CallView) -> CallView | None:
    later = [c for c in v.calls if c.step > call.step]
    return later[0] if later else None


def repeated_call(v: TraceView) -> list[Hit]:
    """A call identical (name and arguments) to an earlier successful one with no write in between.

    Calls repeated after an error are ``unrecovered_error``'s business; bash commands count only when
    repeated back to back (re-running ``cat`` after an edit is normal).
    """
    hits = []
    for i, c in enumerate(v.calls):
        if c.malformed:
            continue
        for j in range(i - 1, -1, -1):
            e = v.calls[j]
            if c.source == "bash" and j != i - 1:
                break
            if e.step == c.step:
                continue
            if v.is_write(e.name) and c.source != "bash":
                break
            if e.key == c.key and not h.is_tool_error(e.result) and not h.command_error(e.result):
                hits.append(
                    Hit(
                        "repeated_call",
                        c.step,
                        "state_tracking",
                        f"{c.name} repeats the call of step {e.step} with the same arguments",
                        0.6,
                    )
                )
                break
    return hits


def unrecovered_error(v: TraceView) -> list[Hit]:
    """A tool error followed by the same failing call or by no further call (giving up)."""
    hits = []
    for c in v.calls:
        if c.source == "bash" or not h.is_tool_error(c.result):
            continue
        nxt = _next_call(v, c)
        if nxt is not None and nxt.key == c.key:
            hits.append(
                Hit(
                    "unrecovered_error",
                    nxt.step,
                    "error_recovery",
                    f"repeated the failing {c.name} after: {_clip(c.result, 100)}",
                    0.9,
                    c.step,
                )
            )
        elif nxt is None:
            after = [i for i in range(c.step + 1, len(v.messages)) if v.messages[i].role == "assistant"]
            step = after[0] if after else (c.result_step if c.result_step is not None else c.step)
            hits.append(
                Hit(
                    "unrecovered_error",
                    step,
                    "error_recovery",
                    f"no further call after {c.name} failed: {_clip(c.result, 100)}",
                    0.7,
                    c.step,
                )
            )
    return hits


def missing_write(v: TraceView) -> list[Hit]:
    """Termination before the required writes.

    Heuristic: the user's request contains an action verb (cancel, return, exchange, update, ...), the
    agent has at least one write tool (a name starting with a write verb) and called none of them.
    A final answer that declines with a reason (a policy refusal) lowers severity to 0.3.
    """
    verb = h.write_requested(v)
    if verb is None or not any(v.is_write(t) for t in v.tool_names):
        return []
    if any(v.is_write(c.name) and not c.malformed for c in v.calls):
        return []
    last = max((i for i, m in enumerate(v.messages) if m.role == "assistant"), default=len(v.messages) - 1)
    final = v.final_answer_step()
    refused = final is not None and h.reasoned_refusal(v.text(final))
    return [
        Hit(
            "missing_write",
            last,
            "multi_step_transaction",
            f"user asked to {verb}; the agent ended without calling any write tool"
            + (" (it declined with a reason)" if refused else ""),
            0.3 if refused else 0.7,
        )
    ]


def claimed_write(v: TraceView) -> list[Hit]:
    """The final answer says an action was done (cancelled, returned, ...) that no successful write did.

    A past participle of a write verb counts when the agent has a write tool named with that verb;
    it is a claim without action when no call of such a tool succeeded, or when an id in the same
    sentence was not an argument of any successful one (one of several orders left untouched). Only
    verbs the user's request uses count (a status report "is cancelled" is not a claim), and
    sentences that decline with a reason are skipped.
    """
    step = v.final_answer_step()
    if step is None or v.bash_style:
        return []
    tools: dict[str, set[str]] = {}
    for name in v.tool_names:
        if v.is_write(name):
            tools.setdefault(name.split("_")[0].lower(), set()).add(name)
    done_ids: dict[str, set[str]] = {}
    for c in v.calls:
        if not c.malformed and v.is_write(c.name) and c.result is not None and not h.is_tool_error(c.result):
            done_ids.setdefault(c.name.split("_")[0].lower(), set()).update(
                x.lower().lstrip("#") for x in _ids(c.arguments)
            )
    asked = {h.stem(w) for w in h.content_words(h.request_text(v))} | set(
        re.findall(r"[a-z]+", h.request_text(v).lower())
    )
    for sentence in h.sentences(v.text(step)):
        if h.reasoned_refusal(sentence):
            continue
        for verb in sorted(h.claimed_verbs(sentence, {t for t in tools if t in asked or h.stem(t) in asked})):
            ids = {x for x in h.claim_tokens(sentence) if h.norm_number(x) is None}
            missing = sorted(ids - done_ids.get(verb, set())) if verb in done_ids else sorted(ids) or ["-"]
            if missing:
                what = "no successful call" if verb not in done_ids else f"not for {', '.join(missing[:3])}"
                return [
                    Hit(
                        "claimed_write",
                        step,
                        "multi_step_transaction",
                        f"final answer claims '{verb}' ({_clip(sentence, 80)}); {what} of "
                        f"{', '.join(sorted(tools[verb]))}",
                        0.7,
                    )
                ]
    return []


def unsupported_claim(v: TraceView) -> list[Hit]:
    """Ids, emails and numbers in the final answer that no tool output (or user/system message) contains."""
    step = v.final_answer_step()
    if step is None or v.bash_style or not any(m.role == "tool" for m in v.messages[:step]):
        return []
    ctx = h.Context(m.content or "" for m in v.messages[:step] if m.role in h.CONTEXT_ROLES)
    missing = sorted(t for t in h.claim_tokens(v.text(step)) if not ctx.supports(t))
    if not missing:
        return []
    return [
        Hit(
            "unsupported_claim",
            step,
            "state_tracking",
            f"final answer states {', '.join(missing[:4])}, found in no tool output",
            0.5,
        )
    ]


def irrelevant_call(v: TraceView) -> list[Hit]:
    """A tool call although the request is out of scope (no content word shared with the tools).

    Silent when the first call's output shares a content word with the request: the tools knew about
    it (a product name the tool descriptions do not mention), so it was in scope. Silent too when the
    first call is malformed: that is the failure seen, and no output tells the scope.
    """
    if not v.calls or not h.out_of_scope(v):
        return []
    c = v.calls[0]
    if c.malformed:
        return []  # the call's format failed first, and there is no output to check the scope against
    if not h.is_tool_error(c.result) and h.content_words(c.result or "") & h.content_words(h.request_text(v)):
        return []  # the tool's answer is about what the user asked: the request was in scope
    return [
        Hit(
            "irrelevant_call",
            c.step,
            "irrelevance_refusal",
            f"called {c.name} for an out-of-scope request: {_clip(h.request_text(v), 100)}",
            0.7,
        )
    ]


def no_call(v: TraceView) -> list[Hit]:
    """An in-scope request (it shares words with the tools) answered without calling any tool.

    The agent had tools that fit the request and chose none: whatever it answered is unfounded.
    Bash-in-text agents and unknown tool lists are not judged.
    """
    if v.calls or v.bash_style or not v.trajectory.tools or h.out_of_scope(v) is not False:
        return []
    first = next((i for i, m in enumerate(v.messages) if m.role == "assistant"), None)
    if first is None:
        return []
    return [
        Hit(
            "no_call",
            first,
            "tool_selection",
            f"answered an in-scope request without any of {len(v.tool_names)} tools: "
            f"{_clip(h.request_text(v), 80)}",
            0.7,
        )
    ]


def write_without_confirmation(v: TraceView) -> list[Hit]:
    """A write call not preceded by an explicit user confirmation, when the policy asks for one.

    A logged policy (system prompt) that never mentions confirmation does not require it; without a
    logged policy the tau-bench convention (confirm every write) applies.
    """
    if not h.confirmation_required(v):
        return []
    return [
        Hit(
            "write_without_confirmation",
            c.step,
            "policy_adherence",
            f"{c.name} called without an explicit user confirmation before it",
            0.6,
        )
        for c in v.calls
        if c.source != "bash" and not c.malformed and v.is_write(c.name) and not h.confirmed_before(v, c.step)
    ]


def _ids(arguments: dict[str, Any]) -> set[str]:
    return {str(x) for x in h.checkable_values(arguments) if isinstance(x, str)}


def stale_write(v: TraceView) -> list[Hit]:
    """A write that targets exactly the objects an earlier successful write of the same tool already did.

    The agent lost track of which object it had handled (e.g. cancelled the first order twice instead
    of the second one).
    """
    hits = []
    writes = [c for c in v.calls if c.source != "bash" and not c.malformed and v.is_write(c.name)]
    for i, c in enumerate(writes):
        ids = _ids(c.arguments)
        if not ids:
            continue
        earlier = next(
            (
                e
                for e in writes[:i]
                if e.name == c.name and not h.is_tool_error(e.result) and ids <= _ids(e.arguments)
            ),
            None,
        )
        if earlier is not None:
            hits.append(
                Hit(
                    "stale_write",
                    c.step,
                    "state_tracking",
                    f"{c.name} on {', '.join(sorted(ids)[:3])} again, already done at step {earlier.step}",
                    0.85,
                )
            )
    return hits


def precondition_violation(v: TraceView) -> list[Hit]:
    """A write whose tool name or description requires a status the target object does not have.

    Status words are the ``status`` values seen in tool outputs (pending, delivered, ...); a write
    tool naming one of them (``cancel_pending_order``) or saying "Only X orders ..." in its description
    requires it, and the latest tool output about the call's id argument says which status the object
    has.
    """
    words = h.status_words(v)
    if not words:
        return []
    specs = {t.name: t for t in v.trajectory.tools}
    hits = []
    for c in v.calls:
        if c.source == "bash" or c.malformed or not v.is_write(c.name):
            continue
        spec = specs.get(c.name)
        required = h.required_states(c.name, spec.description if spec else "", words)
        if not required:
            continue
        for ident in sorted(_ids(c.arguments)):
            status = h.observed_status(v, ident, c.step)
            if status is not None and status not in required:
                hits.append(
                    Hit(
                        "precondition_violation",
                        c.step,
                        "policy_adherence",
                        f"{c.name} requires status {'/'.join(sorted(required))}; {ident} is {status!r}",
                        0.8,
                    )
                )
                break
    return hits


def window_violation(v: TraceView) -> list[Hit]:
    """A write outside a policy time window ("... returned ... only within 30 days of the delivery date").

    Needs a logged policy with such a rule and a "Today is YYYY-MM-DD" date. The rule covers writes
    whose verb is in the rule's sentence; the event date is the target object's date field whose name
    shares its first five letters with the event word (delivery -> delivered_date) in the latest tool
    output about the call's id argument.
    """
    policy = h.policy_text(v)
    rules, now = h.time_windows(policy), h.today(policy)
    if not rules or now is None:
        return []
    hits = []
    for c in v.calls:
        if c.source == "bash" or c.malformed or not v.is_write(c.name):
            continue
        verb = h.stem(c.name.split("_")[0].lower())
        for days, event, words in rules:
            if verb not in words:
                continue
            late = None
            for ident in sorted(_ids(c.arguments)):
                dates = h.observed_dates(v, ident, c.step)
                field = next((k for k in sorted(dates) if k.lower().startswith(event[:5])), None)
                if field is not None:
                    age = (date.fromisoformat(now) - date.fromisoformat(dates[field])).days
                    if age > days:
                        late = f"{c.name} on {ident}: {field} {dates[field]} is {age} days before {now}"
                        break
            if late:
                evidence = f"{late}, over the {days}-day limit"
                hits.append(Hit("window_violation", c.step, "policy_adherence", evidence, 0.8))
                break
    return hits


def command_error(v: TraceView) -> list[Hit]:
    """Traceback, non-zero exit or 'command not found' in a command observation.

    Severity 0.3 when the next command differs (the agent reacted), 0.8 when it repeats the command,
    0.7 when nothing follows.
    """
    hits = []
    for c in v.calls:
        why = h.command_error(c.result)
        if why is None or (c.source != "bash" and h.is_tool_error(c.result)):
            continue
        nxt = _next_call(v, c)
        severity = 0.7 if nxt is None else (0.8 if nxt.key == c.key else 0.3)
        hits.append(
            Hit(
                "command_error",
                c.result_step if c.result_step is not None else c.step,
                "error_recovery",
                f"{c.name}: {why}: {_clip(c.arguments.get('command') or c.name, 80)}",
                severity,
            )
        )
    return hits


DETECTORS: dict[str, Callable[[TraceView], list[Hit]]] = {
    "malformed_call": malformed_call,
    "unknown_tool": unknown_tool,
    "schema_violation": schema_violation,
    "ungrounded_argument": ungrounded_argument,
    "repeated_call": repeated_call,
    "unrecovered_error": unrecovered_error,
    "missing_write": missing_write,
    "unsupported_claim": unsupported_claim,
    "claimed_write": claimed_write,
    "irrelevant_call": irrelevant_call,
    "no_call": no_call,
    "write_without_confirmation": write_without_confirmation,
    "stale_write": stale_write,
    "precondition_violation": precondition_violation,
    "window_violation": window_violation,
    "command_error": command_error,
}

# Prior confidence that a hit is the root cause of a failure: call-level errors are causes; errors
# left unrecovered, missing writes and unsupported claims are often symptoms of an earlier one.
PRIOR: dict[str, float] = {
    "malformed_call": 0.95,
    "unknown_tool": 0.9,
    "wrong_tool": 0.9,
    "schema_violation": 0.85,
    "stale_write": 0.85,
    "precondition_violation": 0.85,
    "window_violation": 0.85,
    "ungrounded_argument": 0.85,
    "irrelevant_call": 0.8,
    "no_call": 0.75,
    "write_without_confirmation": 0.75,
    "repeated_call": 0.6,
    "unrecovered_error": 0.65,
    "command_error": 0.6,
    "missing_write": 0.55,
    "claimed_write": 0.55,
    "unsupported_claim": 0.5,
}


ROOT = frozenset(
    {
        "malformed_call",
        "unknown_tool",
        "wrong_tool",
        "schema_violation",
        "ungrounded_argument",
        "irrelevant_call",
        "stale_write",
        "precondition_violation",
        "window_violation",
    }
)
STOPPERS = ROOT | {"unrecovered_error", "command_error", "no_call"}
WRONG_CALL = frozenset({"malformed_call", "unknown_tool", "wrong_tool", "irrelevant_call"})


def explain(hits: list[Hit], min_severity: float = 0.5) -> list[Hit]:
    """Mark hits that are symptoms of an earlier root cause (``explained_by``), so a cascade counts once.

    - an argument problem (ungrounded, schema) on a call that is wrong as a whole (malformed, unknown
      tool, out of scope) is explained by that;
    - an unrecovered error whose failing call already has a root-cause hit is explained by it;
    - a missing write (or a claimed one) is explained by a root-cause or error hit at or before its
      step at or above ``min_severity``
      (the agent stopped because a call failed); a redundant read or a policy slip does not stop an
      agent, so those never explain it.
    """
    out = []
    for hit in hits:
        cause: Hit | None = None
        if hit.detector in ("ungrounded_argument", "schema_violation"):
            cause = next((x for x in hits if x.step == hit.step and x.detector in WRONG_CALL), None)
        elif hit.detector == "unrecovered_error" and hit.cause_step is not None:
            cause = next(
                (
                    x
                    for x in hits
                    if x.step == hit.cause_step and x.detector in ROOT and x.severity >= min_severity
                ),
                None,
            )
        elif hit.detector in ("missing_write", "claimed_write"):
            cause = next(
                (
                    x
                    for x in hits
                    if x.step <= hit.step
                    and x is not hit
                    and x.severity >= min_severity
                    and x.detector in STOPPERS
                ),
                None,
            )
        out.append(replace(hit, explained_by=f"{cause.detector}@{cause.step}") if cause else hit)
    return out


def detect(trajectory: Trajectory, view: TraceView | None = None, min_severity: float = 0.5) -> list[Hit]:
    """Every detector's hits on one trajectory, ordered by step then detector, symptoms marked."""
    view = view or build_view(trajectory)
    hits = sorted((hit for fn in DETECTORS.values() for hit in fn(view)), key=lambda x: (x.step, x.detector))
    return explain(hits, min_severity)
