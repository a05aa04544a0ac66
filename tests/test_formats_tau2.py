"""tau2-bench Results reader."""

from __future__ import annotations

import json
from pathlib import Path

from traceops.formats import Rejected, iter_items
from traceops.formats.tau2 import Tau2Reader, reward_breakdown
from traceops.schema import Outcome, Trajectory

FIXTURES = Path(__file__).parent / "fixtures" / "formats"
RESULTS = FIXTURES / "tau2" / "airline_results.json"


def test_one_trajectory_per_simulation_with_outcome_and_breakdown() -> None:
    ok, failed = list(Tau2Reader().read(RESULTS))
    assert (ok.task_id, ok.domain, ok.agent) == ("0", "airline", "gpt-4.1-mini-2025-04-14")
    assert ok.outcome.success is True and ok.outcome.reward == 1.0
    assert ok.outcome.reward_breakdown == {"db": 1.0, "communicate": 1.0, "action": 1.0}
    assert failed.outcome.success is False
    assert failed.outcome.reward_breakdown == {"db": 0.0, "communicate": 0.0, "action": 0.5}
    assert [s.source.record for s in (ok, failed)] == ["simulations[0]", "simulations[1]"]


def test_tools_tool_calls_and_tool_messages_follow_tau2_fields() -> None:
    ok, failed = list(Tau2Reader().read(RESULTS))
    assert {tool.name for tool in ok.tools} == {"get_user_details", "cancel_reservation"}
    spec = next(tool for tool in ok.tools if tool.name == "cancel_reservation")
    assert spec.description == "Cancel the whole reservation."
    assert spec.parameters["required"] == ["reservation_id"]
    call = ok.messages[2].tool_calls[0]
    assert (call.id, call.name) == ("call_1", "get_user_details")
    assert call.arguments == {"user_id": "emma_kim_9957"}
    assert ok.messages[3].role == "tool" and ok.messages[3].tool_call_id == "call_1"
    assert failed.metadata["tool_error_steps"] == [3]
    assert failed.metadata["termination_reason"] == "user_stop" and failed.metadata["id"] == "5f1c2a9e-0002"


def test_outcomes_table_overrides_by_task_id() -> None:
    items = list(Tau2Reader().read(RESULTS, outcomes={"1": Outcome(success=True, reward=1.0)}))
    assert [item.outcome.success for item in items] == [True, True]


def test_directory_format_reads_simulation_files_with_sibling_info() -> None:
    items = list(iter_items([FIXTURES / "tau2_dir"]))
    (sim,) = items
    assert isinstance(sim, Trajectory) and sim.source.format == "tau2"
    assert sim.domain == "airline" and len(sim.tools) == 2
    assert sim.id == next(iter(Tau2Reader().read(RESULTS))).id  # same run, same content hash


def test_bad_simulation_is_rejected_alone(tmp_path: Path) -> None:
    data = json.loads(RESULTS.read_text())
    data["simulations"][0]["messages"][4]["role"] = "narrator"
    del data["simulations"][1]["task_id"]
    data["simulations"].append("not a simulation")
    data["simulations"].append(json.loads(RESULTS.read_text())["simulations"][1])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    items = list(Tau2Reader().read(path))
    assert len(items) == 4
    assert [type(item) for item in items] == [Rejected, Rejected, Rejected, Trajectory]
    assert items[0].field == "messages[4].role" and "narrator" in items[0].reason
    assert items[1].field == "task_id" and items[1].record == "simulations[1]"
    assert json.loads(items[0].raw)["id"] == "5f1c2a9e-0001"


def test_reward_breakdown_uses_numeric_parts_only() -> None:
    info = {"reward": 0.0, "reward_breakdown": {"DB": 1.0, "COMMUNICATE": None},
            "nl_assertions": [{"met": True}, {"met": False}],
            "env_assertions": [{"reward": 0.5}], "db_check": {"db_match": True, "db_reward": 1.0}}
    assert reward_breakdown(info) == {"db": 1.0, "nl_assertion": 0.5, "env_assertion": 0.5}
