"""Rehearsal: each adapter's SFT data also holds the agent's own logged successes, in its real interface.

Synthetic environments teach a capability; they do not show what the agent already did right in
production. A measured retail night trained adapters only on environments (a generic system prompt, a
``call_api`` wrapper or generic record tools, never the logged policy prompt and tools) and its composite
then called ``get_user_details`` on every held-out real request, including the out-of-scope ones ("time
in Nairobi") the base had answered without a call (what the grader scores right): 0/32 against the
base's 6/32. Rehearsal mixes in the agent's logged SUCCESSFUL trajectories so the adapters keep that
behaviour and see the prompt they are served with.

* Only the train side of the held-out split (``traceops.heldout``, the ``evaluate.requests`` seed and
  fraction): a held-out task is never rehearsed.
* One run per task (the lowest trajectory id, deterministic), of the adapter's environment domain when
  it has one; a run needs a user turn before its first assistant turn.
* Rendered through the serving path: ``model.adapted.training_conversation`` (the logged system prompt,
  the ``<tool_call>`` form a served adapter is prompted and answers in) with the tools as logged, so a
  row's prefix up to its request turn is exactly the prompt of that request served.
* A row keeps whole assistant turns: the whole run when it fits ``max_length`` tokens, else up to the
  last assistant turn that fits, never less than the request turn (``heldout.request_step``: the one the
  held-out gate scores); a row longer than ``max_length`` is reported by ``Rehearsal.max_tokens`` and
  ``sft_budget`` lengthens SFT's rows to it rather than cut a prompt (training on a truncated prompt is
  training on an interface production never shows), checkpointing gradients when memory needs it.
* ``share`` of the mixed SFT rows (``train.rehearsal_share``): ``round(share / (1 - share) * n)`` runs
  for ``n`` environment rows, at most the runs there are, alternating between the kinds of request reply
  (no call, calls) so a rare kind, such as a correct decline, is not left out by chance, and within a kind
  in a seeded hash order of the run ids (stable as logs grow, like the held-out split).

Pure: the caller loads the trajectories and the tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from traceops.errors import ConfigError
from traceops.hashing import content_hash
from traceops.heldout import request_step, train_trajectories
from traceops.schema import Trajectory
from traceops.train.budgets import Budget, check_fits

NO_CALL, CALLS = "no_call", "calls"


@dataclass(frozen=True)
class Rehearsal:
    """The rehearsal rows of one adapter and what they came from.

    ``rows`` are SFT rows (``{"messages", "tools"}``, tools as a JSON string, as ``train.data.sft_row``);
    ``trajectory_ids`` the logged runs rehearsed, in row order; ``kinds`` their request reply kind per
    id; ``tokens`` each row's length; ``available`` the eligible runs the share was drawn from.
    """

    share: float
    rows: list[dict[str, str | list[dict[str, str]]]] = field(default_factory=list)
    trajectory_ids: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    available: int = 0

    @property
    def max_tokens(self) -> int:
        """The longest row's token count (0 without rows)."""
        return max(self.tokens, default=0)

    @property
    def content_hash(self) -> str:
        """Hash of the rows themselves: what a training cache or lineage needs to tell two apart."""
        return content_hash(self.rows)

    def identity(self) -> dict[str, Any]:
        """JSON-ready record for the adapter's config and lineage: share, counts, hash and ids."""
        counts = {NO_CALL: 0, CALLS: 0}
        for kind in self.kinds.values():
            counts[kind] += 1
        return {"share": self.share, "rows": len(self.rows), "available": self.available,
                "by_kind": counts, "max_tokens": self.max_tokens, "hash": self.content_hash,
                "trajectory_ids": list(self.trajectory_ids)}


def sft_budget(budget: Budget, longest: int, sizes: dict[str, int], available: int | None = None) -> Budget:
    """The budget SFT runs with: ``budget`` itself, or with rows lengthened to the ``longest`` SFT row (in
    tokens: a rehearsed run, or a task that opens with a logged prompt, ~2,400 tokens in retail against
    budget small's 1,792) when that is longer, with SFT gradient checkpointing switched on when the longer
    rows would not fit the free memory without it. Only SFT: GRPO's rows are the environments' own.
    ``sizes`` is ``adapter.inspect_base``'s; raises ConfigError (``check_fits``'s, saying what to do) when
    not even checkpointing fits."""
    if longest <= budget.sft_max_length:
        return budget
    longer = replace(budget, sft_max_length=longest)

    def fits(candidate: Budget) -> Budget:
        # The SFT phase alone: a GRPO phase of one row, checkpointed, is never the larger of the two.
        probe = replace(candidate, grpo_prompts_per_step=1, num_generations=1, gradient_checkpointing=True)
        check_fits(probe, sizes["n_params"], sizes["trainable"], sizes["hidden"], sizes["layers"],
                   sizes["heads"], sizes["vocab"], available=available,
                   eager_attention=bool(sizes.get("eager_attention")))
        return candidate

    try:
        return fits(longer)
    except ConfigError:
        return fits(replace(longer, sft_gradient_checkpointing=True))


def rehearsal_count(share: float, env_rows: int, available: int) -> int:
    """How many runs to rehearse beside ``env_rows`` environment rows so they make ``share`` of the mix,
    at most ``available``. ``share`` is in [0, 1)."""
    if share <= 0 or env_rows <= 0:
        return 0
    return min(available, round(share / (1.0 - share) * env_rows))


def eligible_trajectories(trajectories: Iterable[Trajectory], seed: int, fraction: float,
                          domains: Iterable[str] | None = None, succeeded: bool = True) -> list[Trajectory]:
    """The runs rehearsal may draw from: train side of the held-out split, succeeded (``succeeded``
    False: failed ones too), of ``domains`` (None: any), with a user turn before the first assistant
    turn; one per task (lowest id), ordered by task id."""
    wanted = None if domains is None else set(domains)
    by_task: dict[str, Trajectory] = {}
    for trajectory in train_trajectories(trajectories, seed, fraction):
        if (succeeded and not trajectory.outcome.succeeded) or (wanted is not None
                                                                and trajectory.domain not in wanted):
            continue
        at = request_step(trajectory)
        if at >= len(trajectory.messages) or not any(m.role == "user" for m in trajectory.messages[:at]):
            continue
        kept = by_task.get(trajectory.task_id)
        if kept is None or trajectory.id < kept.id:
            by_task[trajectory.task_id] = trajectory
    return [by_task[task] for task in sorted(by_task)]


def reply_kind(trajectory: Trajectory) -> str:
    """``calls`` when the request turn calls a tool, else ``no_call`` (a decline or a plain answer)."""
    return CALLS if trajectory.messages[request_step(trajectory)].tool_calls else NO_CALL


def _tokens(tokenizer: Any, messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> int:
    """Token count of a conversation as SFT renders it (the tokenizer's chat template, with tools)."""
    out = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=True)
    return len(out["input_ids"])


def served_conversation(trajectory: Trajectory) -> tuple[list[dict[str, str]], list[dict[str, Any]], int]:
    """A run as the serving path renders it: its conversation (``model.adapted.training_conversation``),
    its tools in OpenAI form and the length of the conversation's prefix that ends with the request turn's
    reply (``heldout.request_step``)."""
    from traceops.model.adapted import training_conversation
    from traceops.model.toolcalls import tools_to_openai

    conversation = training_conversation(trajectory.messages)
    # training_conversation adds a system message when the log has none: positions shift by one then.
    shift = len(conversation) - len(trajectory.messages)
    return conversation, tools_to_openai(trajectory.tools), request_step(trajectory) + shift + 1


def rehearsal_row(trajectory: Trajectory, tokenizer: Any,
                  max_length: int) -> tuple[dict[str, str | list[dict[str, str]]], int]:
    """One run as an SFT row cut to whole assistant turns (see the module docstring), with its tokens."""
    conversation, tools, first = served_conversation(trajectory)
    ends = [i + 1 for i, m in enumerate(conversation) if m["role"] == "assistant"]
    ends = [end for end in ends if end >= first] or [first]
    chosen, tokens = ends[0], _tokens(tokenizer, conversation[:ends[0]], tools)
    for end in reversed(ends[1:]):  # the longest whole-turn prefix within max_length
        count = _tokens(tokenizer, conversation[:end], tools)
        if count <= max_length:
            chosen, tokens = end, count
            break
    return {"messages": conversation[:chosen], "tools": json.dumps(tools)}, tokens


def draw_rehearsal(trajectories: Sequence[Trajectory], share: float, env_rows: int,
                   seed: int = 0) -> list[Trajectory]:
    """The runs to rehearse from ``trajectories`` (``eligible_trajectories``' result): ``rehearsal_count``
    of them, alternating between reply kinds (no call first), each kind in the order of a seeded hash of
    the run id, so the draw stays the same as logs grow unless a new run hashes ahead of a drawn one."""
    pools: dict[str, list[Trajectory]] = {NO_CALL: [], CALLS: []}
    for trajectory in sorted(trajectories, key=lambda t: (content_hash({"seed": seed, "id": t.id}), t.id)):
        pools[reply_kind(trajectory)].append(trajectory)
    wanted = rehearsal_count(share, env_rows, len(trajectories))
    picked: list[Trajectory] = []
    while len(picked) < wanted:
        for kind in (NO_CALL, CALLS):
            if pools[kind] and len(picked) < wanted:
                picked.append(pools[kind].pop(0))
    return picked


def drawn_key(picked: Iterable[Trajectory], share: float) -> str:
    """A cache-key part naming a draw: the share and the drawn runs' ids (content hashes, so an edited
    log changes it). The rows also depend on the tokenizer and the row length, which a training key
    holds already (base model, budget)."""
    return content_hash({"share": share, "trajectories": [t.id for t in picked]})


def build_rehearsal(picked: Sequence[Trajectory], share: float, available: int, tokenizer: Any,
                    max_length: int) -> Rehearsal:
    """The rehearsal of the drawn runs: each rendered by ``rehearsal_row``, in draw order."""
    out = Rehearsal(share=share, available=available)
    for trajectory in picked:
        row, tokens = rehearsal_row(trajectory, tokenizer, max_length)
        out.rows.append(row)
        out.tokens.append(tokens)
        out.trajectory_ids.append(trajectory.id)
        out.kinds[trajectory.id] = reply_kind(trajectory)
    return out
