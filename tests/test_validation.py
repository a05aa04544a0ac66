"""The GX ingest suite flags each kind of bad trajectory with its check and field; the cluster suite."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import pyarrow as pa
import pytest

from traceops import config
from traceops.schema import Message, Outcome, Source, ToolCall, Trajectory
from traceops.store import Batch, to_batch
from traceops.validation import Limits, RunValidation, validate_batch, validate_clusters


def good(i: int = 0) -> Trajectory:
    return Trajectory(
        task_id=f"t{i}",
        messages=[
            Message(role="user", content="cancel my order"),
            Message(role="assistant", content="ok"),
            Message(role="assistant", tool_calls=[ToolCall(id="c1", name="cancel", arguments={"id": i})]),
            Message(role="tool", content="done", tool_call_id="c1"),
            Message(role="assistant", content="Cancelled."),
        ],
        outcome=Outcome(success=False, reward=0.0),
        source=Source(format="openai", file="f.jsonl", record=i),
    )


def _bad_role(t: Trajectory) -> None:
    t.messages[1].role = "bot"  # type: ignore[assignment]  # pydantic does not re-validate assignments


def _bad_args(t: Trajectory) -> None:
    t.messages[2].tool_calls[0].arguments = ["not", "an", "object"]  # type: ignore[assignment]


def _unknown_call(t: Trajectory) -> None:
    t.messages[3].tool_call_id = "c9"


def _result_before_call(t: Trajectory) -> None:
    t.messages[2], t.messages[3] = t.messages[3], t.messages[2]


def _call_not_from_assistant(t: Trajectory) -> None:
    t.messages[2].role = "user"


def _bad_outcome(t: Trajectory) -> None:
    t.outcome.success = "maybe"  # type: ignore[assignment]


def _nan_reward(t: Trajectory) -> None:
    t.outcome.reward = float("nan")


def _no_messages(t: Trajectory) -> None:
    t.messages = []


CASES: list[tuple[Callable[[Trajectory], None], str, str]] = [
    (_bad_role, "role_allowed", "messages[1].role"),
    (_bad_args, "tool_args_object", "messages[2].tool_calls"),
    (_unknown_call, "tool_result_answered", "messages[3].tool_call_id"),
    (_result_before_call, "tool_result_answered", "messages[2].tool_call_id"),
    (_call_not_from_assistant, "tool_result_answered", "messages[3].tool_call_id"),
    (_bad_outcome, "outcome_known", "outcome.success"),
    (_nan_reward, "reward_finite", "outcome.reward"),
    (_no_messages, "steps_count", "messages"),
]


@pytest.mark.parametrize(("mutate", "check", "field"), CASES, ids=[c[1] + ":" + c[0].__name__ for c in CASES])
def test_each_failure_is_flagged_with_check_and_field(mutate: Callable[[Trajectory], None], check: str,
                                                      field: str) -> None:
    bad = good(1)
    mutate(bad)
    result = validate_batch(to_batch([good(0), bad, good(2)]), Limits())
    assert list(result.failures) == [1]
    failure = result.failures[1]
    assert (failure.check, failure.field) == (check, field)
    assert failure.reason
    assert result.result["success"] is False
    assert result.counts[check] == (3, 1)


def test_valid_batch_passes_and_record_is_gx() -> None:
    result = validate_batch(to_batch([good(0), good(1)]), Limits())
    assert result.failures == {}
    assert result.result["success"] is True
    types = {r["expectation_config"]["type"] for r in result.result["results"]}
    assert "expect_column_values_to_be_in_set" in types and "expect_column_values_to_be_between" in types
    run = RunValidation("r1", Limits())
    run.add(result)
    record = run.to_dict()
    assert record["success"] is True and record["n_batches"] == 1
    assert {c["check"] for c in record["checks"]} >= {"role_allowed", "steps_contiguous", "content_length"}


def test_size_limits_come_from_settings(tmp_path) -> None:
    (tmp_path / "params.yaml").write_text("ingest:\n  max_steps: 4\n  max_content_chars: 10\n")
    limits = Limits.from_settings(config.load(tmp_path))
    assert (limits.max_steps, limits.max_content_chars) == (4, 10)
    long_text = good(0)
    long_text.messages = long_text.messages[:4]
    long_text.messages[0].content = "x" * 11
    result = validate_batch(to_batch([good(1), long_text]), limits)
    assert result.failures[0].check == "steps_count"  # 5 messages > 4
    assert (result.failures[1].check, result.failures[1].field) == ("content_length", "messages[0].content")


def test_non_contiguous_steps_are_flagged() -> None:
    batch = to_batch([good(0), good(1)])
    steps = batch.steps.set_column(1, "step", pa.array([0, 1, 2, 3, 4, 0, 1, 3, 4, 5], type=pa.int32()))
    broken = Batch(batch.trajectories, steps, batch.calls, batch.raw_success, batch.raw_reward)
    result = validate_batch(broken, Limits())
    assert list(result.failures) == [1]
    assert (result.failures[1].check, result.failures[1].field) == ("steps_contiguous", "messages[2]")


def test_tool_call_ids_can_be_optional() -> None:
    loose = good(0)
    loose.messages[3].tool_call_id = None
    assert validate_batch(to_batch([loose]), Limits()).failures[0].check == "tool_result_answered"
    assert validate_batch(to_batch([loose]), Limits(require_tool_call_ids=False)).failures == {}


def test_cluster_suite() -> None:
    clusters = pd.DataFrame({"cluster": [0, 1, 2, -1], "size": [40, 12, 3, 10],
                             "silhouette": [0.6, 0.15, 0.5, None], "is_noise": [False, False, False, True]})
    ok = validate_clusters(clusters, min_size=3, max_noise_share=0.2, min_silhouette=0.1)
    assert ok.success and ok.failures == []

    bad = validate_clusters(clusters, min_size=5, max_noise_share=0.1, min_silhouette=0.2)
    assert not bad.success
    by_check = {f["check"]: f for f in bad.failures}
    assert by_check["min_size"]["clusters"] == [2]
    assert by_check["min_silhouette"]["clusters"] == [1]
    assert by_check["max_noise_share"]["observed_value"] == pytest.approx(10 / 65)
    assert bad.result["success"] is False


def test_cluster_suite_names_missing_columns() -> None:
    with pytest.raises(ValueError, match="is_noise"):
        validate_clusters(pd.DataFrame({"cluster": [0], "size": [3]}), 1, 0.5, 0.0)
