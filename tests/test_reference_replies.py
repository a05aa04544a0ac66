"""A user's reference replies teach: train-side failed requests are mined with their right reply.

On the BFCL logs the embedded agent got almost only its declines right, so synthesis could replay only
declines: the parallel and multi-function requests that make up most of the held-out set were composed
tool by tool ("In the first case, ..."), never as users ask them. The reference file the night already
reads for evaluation gives the right reply to every logged request; on the train side of the split
these tests pin that it turns failed first exchanges into replayable ones.
"""

from __future__ import annotations

import random
from pathlib import Path

from traceops.envs.exchanges import replay_task
from traceops.envs.grounding import ValueFactory, build_grounding
from traceops.envs.native import check_task, no_call_share
from traceops.formats.openai import OpenAIReader
from traceops.formats.outcomes import load_outcomes
from traceops.heldout import is_heldout, load_references, request_values, request_words, split_trajectories
from traceops.reference_replies import REPLY_FROM, answered_by_references
from traceops.schema import Message, Outcome, Trajectory

BFCL = Path(__file__).resolve().parents[1] / "data" / "public" / "bfcl"


def _bfcl() -> tuple[list[Trajectory], list[Trajectory]]:
    items = OpenAIReader().read(BFCL / "logs" / "embedded.jsonl", load_outcomes(BFCL / "outcomes.jsonl"))
    return split_trajectories([t for t in items if isinstance(t, Trajectory)], 0, 0.2)


def test_failed_runs_are_answered_by_their_first_reference_and_the_rest_kept():
    train, _ = _bfcl()
    references = load_references(BFCL / "references.jsonl")
    answered = answered_by_references(train, references)
    assert len(answered) == len(train)
    changed = 0
    for before, after in zip(train, answered, strict=True):
        if before.outcome.succeeded or before.task_id not in references:
            assert after is before  # a run the agent got right is its own reference
            continue
        changed += 1
        step = next(i for i, m in enumerate(before.messages) if m.role == "assistant")
        assert after.messages[:step] == before.messages[:step]
        assert after.messages[step:] == [references[before.task_id][0]]
        assert after.outcome.succeeded and after.source == before.source and after.id != before.id
        assert after.metadata[REPLY_FROM] == "reference" and after.metadata["answers"] == before.id
    assert changed > len(train) // 2  # the embedded agent failed most BFCL requests


def test_a_run_whose_reference_answers_a_later_turn_is_kept_as_logged():
    # The request turn is the first one that calls a tool; a reference answers that turn. When the agent
    # spoke before it, the first exchange grounding mines is not the one the reference answers.
    run = Trajectory(task_id="t1", tools=[], source={"format": "openai", "file": "f", "record": 0},
                     outcome=Outcome(success=False),
                     messages=[Message(role="user", content="hi"),
                               Message(role="assistant", content="Hello!"),
                               Message(role="user", content="Cancel order 12."),
                               Message(role="assistant", content=None, tool_calls=[
                                   {"id": "c", "name": "cancel", "arguments": {"order": 13}}])])
    reference = Message(role="assistant", content=None,
                        tool_calls=[{"id": "r", "name": "cancel", "arguments": {"order": 12}}])
    assert answered_by_references([run], {"t1": [reference]}) == [run]
    assert answered_by_references([run], {}) == [run]


def test_referenced_requests_become_replays_in_the_users_words():
    train, heldout = _bfcl()
    exclude = sorted(request_values(heldout))
    logged_only = build_grounding(train, exclude=exclude, phrasing_from=train, interface="native")
    answered = answered_by_references(train, load_references(BFCL / "references.jsonl"))
    grounding = build_grounding(train, exclude=exclude, phrasing_from=answered, interface="native")
    calls = [t for t in grounding.exchanges if t["calls"]]
    parallel = [t for t in calls if len(t["calls"]) > 1]
    # The agent's own successes were nearly all declines; the references add calls, parallel ones too.
    assert len(calls) > 4 * len([t for t in logged_only.exchanges if t["calls"]])
    assert parallel and grounding.max_parallel > 1
    # Declines are now counted over every answered request, as their real share (about a quarter).
    assert no_call_share(grounding) < no_call_share(logged_only)
    rng = random.Random(0)
    values = ValueFactory(grounding, rng, exclude)
    heldout_texts = {m.content for t in heldout for m in t.messages if m.role == "user"}
    replays = [replay_task(rng, values, grounding, calls=True) for _ in range(300)]
    for task in replays:
        # schema-valid gold calls over the request's own tools, though two BFCL tools share the name
        # calculate_density with different parameters (grounding keeps one schema per name)
        check_task(task)
        assert task["gold"]["calls"] and task["instruction"] not in heldout_texts


def test_a_request_logged_under_two_task_ids_stays_out_of_training():
    # BFCL's categories share some questions: the same words under another task id must not train
    # a model that is then scored on them.
    def run(task_id: str, words: str) -> Trajectory:
        return Trajectory(task_id=task_id, tools=[], source={"format": "openai", "file": "f", "record": 0},
                          outcome=Outcome(success=False),
                          messages=[Message(role="user", content=words),
                                    Message(role="assistant", content="no")])

    runs = [run(f"t{i}", f"request {i}") for i in range(40)]
    _, held = split_trajectories(runs, 0, 0.25)
    assert held
    twin_id = next(f"twin{i}" for i in range(100) if not is_heldout(f"twin{i}", 0, 0.25))
    twin = run(twin_id, f"  {held[0].messages[0].content}\n")
    train, held_again = split_trajectories([*runs, twin], 0, 0.25)
    assert held_again == held and twin not in train
    assert len(train) == len(runs) - len(held)
    assert request_words(twin) == request_words(held[0])
