"""mini-swe-agent and SWE-agent trajectory readers, with outcomes joined from side files."""

from __future__ import annotations

import json
from pathlib import Path

from traceops.formats import Rejected, iter_items, load_outcomes
from traceops.formats.swe_agent import SWEAgentReader
from traceops.schema import Trajectory

FIXTURES = Path(__file__).parent / "fixtures" / "formats"
MINI = FIXTURES / "mini_swe_agent"


def test_real_mini_swe_agent_samples_with_outcomes_side_file() -> None:
    outcomes = load_outcomes(FIXTURES / "outcomes" / "mini_swe_agent_results.json")
    items = list(iter_items([MINI], outcomes=outcomes))
    assert [type(item) for item in items] == [Trajectory, Trajectory]
    by_task = {item.task_id: item for item in items}
    assert by_task["django__django-16255"].outcome.success is True
    assert by_task["django__django-10999"].outcome.success is False
    assert sorted(item.outcome.success for item in items) == [False, True]


def test_report_side_file_gives_the_same_outcomes() -> None:
    outcomes = load_outcomes(FIXTURES / "outcomes" / "swebench_report.json")
    items = {item.task_id: item.outcome.success for item in iter_items([MINI], outcomes=outcomes)}
    assert items == {"django__django-16255": True, "django__django-10999": False}


def test_without_outcomes_the_outcome_is_unknown() -> None:
    assert [item.outcome.success for item in iter_items([MINI])] == [None, None]


def test_bash_actions_stay_in_content_and_become_tool_calls() -> None:
    raw = json.loads((MINI / "django__django-16255.resolved.traj.json").read_text())
    (item,) = list(SWEAgentReader().read(MINI / "django__django-16255.resolved.traj.json"))
    # roles as the source had them
    assert [m.role for m in item.messages] == [m["role"] for m in raw["messages"]]
    assert item.agent == "google/gemini-3-pro-preview" and item.domain == "swe"
    assert [tool.name for tool in item.tools] == ["bash"]
    step = item.messages[2]
    assert step.content == raw["messages"][2]["content"]
    assert step.tool_calls[0].name == "bash"
    assert step.tool_calls[0].arguments == {"command": "ls -R django/contrib/sitemaps"}
    assert item.messages[3].role == "user" and item.messages[3].tool_call_id is None
    assistants = [m for m in item.messages if m.role == "assistant"]
    assert all(m.tool_calls for m in assistants)
    assert item.metadata["exit_status"] == "Submitted" and "diff --git" in item.metadata["submission"]


def test_mini_swe_agent_v2_formats_and_exit_message(tmp_path: Path) -> None:
    doc = {
        "info": {"exit_status": "LimitsExceeded", "submission": "", "mini_version": "2.0.0",
                 "config": {"model": {"model_name": "anthropic/claude-sonnet-4-5"}}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": "Look.\n\n```mswea_bash_command\nls -la\n```",
             "extra": {"actions": [{"command": "ls -la"}]}},
            {"role": "user", "content": "<returncode>0</returncode>", "extra": {"returncode": 0}},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "bash", "arguments": "{\"command\": \"cat setup.py\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "<returncode>0</returncode>"},
            {"role": "exit", "content": "LimitsExceeded", "extra": {"exit_status": "LimitsExceeded"}},
        ],
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "astropy__astropy-12907",
    }
    path = tmp_path / "astropy__astropy-12907.traj.json"
    path.write_text(json.dumps(doc))
    (item,) = list(iter_items([path]))
    assert item.task_id == "astropy__astropy-12907" and len(item.messages) == 6
    assert item.messages[2].tool_calls[0].arguments == {"command": "ls -la"}
    assert item.messages[4].tool_calls[0].id == "toolu_1"
    assert item.messages[5].tool_call_id == "toolu_1"
    assert item.metadata["exit"] == {"content": "LimitsExceeded", "exit_status": "LimitsExceeded"}
    assert item.metadata["trajectory_format"] == "mini-swe-agent-1.1"


def test_swe_agent_function_calling_history() -> None:
    (item,) = list(SWEAgentReader().read(FIXTURES / "swe_agent" / "SWE-agent__test-repo-i1.traj"))
    assert item.task_id == "SWE-agent__test-repo-i1" and item.agent == "gpt-4o"
    assert [m.role for m in item.messages] == ["system", "user"] + ["assistant", "tool"] * 3
    assert item.messages[1].content.startswith("We're currently solving")
    edit = item.messages[4].tool_calls[0]
    assert edit.name == "edit" and edit.arguments["start_line"] == 4
    assert item.messages[5].tool_call_id == "call_2" and item.messages[5].name == "main"
    assert item.tools == []  # native tools: no bash calls were synthesized


def test_swe_agent_text_actions_and_demonstrations() -> None:
    (item,) = list(SWEAgentReader().read(FIXTURES / "swe_agent" / "marshmallow-code__marshmallow-1867.traj"))
    assert item.task_id == "marshmallow-code__marshmallow-1867"
    demo = item.messages[2]
    assert demo.name == "demo" and demo.tool_calls is None  # a demonstration is not the agent's action
    assert item.messages[4].tool_calls[0].arguments == {"command": "create reproduce.py"}
    assert item.messages[5].role == "user"
    assert [tool.name for tool in item.tools] == ["bash"]


def test_swe_agent_steps_only_file(tmp_path: Path) -> None:
    path = tmp_path / "psf__requests-2317.traj"
    path.write_text(json.dumps({"trajectory": [
        {"action": "ls", "observation": "setup.py", "response": "List files.\n```\nls\n```",
         "thought": "List."},
        {"action": "submit", "observation": "", "response": "Submit.", "thought": "Submit."}],
        "info": {"exit_status": "submitted"}}))
    (item,) = list(SWEAgentReader().read(path))
    assert [m.role for m in item.messages] == ["assistant", "user", "assistant", "user"]
    assert item.messages[2].tool_calls[0].arguments == {"command": "submit"}


def test_bad_swe_files_are_rejected_with_field(tmp_path: Path) -> None:
    unknown = tmp_path / "a.traj.json"
    unknown.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "critic"}],
                                   "trajectory_format": "mini-swe-agent-1"}))
    empty = tmp_path / "b.traj"
    empty.write_text(json.dumps({"info": {}}))
    first, second = [item for path in (unknown, empty) for item in SWEAgentReader().read(path)]
    assert isinstance(first, Rejected) and first.field == "messages[1].role" and "critic" in first.reason
    assert isinstance(second, Rejected) and second.field == "history"
    assert second.raw == empty.read_text()
