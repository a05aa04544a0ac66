"""The served-traffic log and feedback: what the server appends is what ingest reads tomorrow."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from traceops import config
from traceops.errors import InputError
from traceops.feedback_api import feedback_routes
from traceops.formats import iter_items, load_outcomes
from traceops.formats.base import Rejected
from traceops.ingest import ingest_paths
from traceops.lineage import raw_files_manifest
from traceops.schema import Trajectory
from traceops.store import load_trajectories
from traceops.traffic import EMAIL_PATTERN, ServedTraffic, UnknownResponseError, day_file, outcomes_file

TOOLS = [{"type": "function", "function": {
    "name": "find_user_id_by_email", "description": "Find a user's id by email.",
    "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}}}]
SERVED_BY = {"model": "traceops.composite", "version": "3", "weights_hash": "abc", "domain": "retail"}


def exchange(n: int, content: str = "Where is my order?", arguments: str | None = None) -> tuple[dict, dict]:
    """A chat-completions request and its response, as the server sees them."""
    request = {"model": "traceops.composite@champion", "tools": TOOLS,
               "messages": [{"role": "system", "content": "You are a retail agent."},
                            {"role": "user", "content": f"{content} (#{n})"}]}
    message: dict = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function",
         "function": {"name": "find_user_id_by_email",
                      "arguments": arguments or json.dumps({"email": f"user{n}@example.com"})}}]}
    response = {"id": f"chatcmpl-{n}", "object": "chat.completion", "model": "traceops.composite",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    return request, response


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_record_writes_a_call_log_that_the_openai_reader_reads(tmp_path: Path) -> None:
    traffic = ServedTraffic(tmp_path)
    for n in range(3):
        traffic.record(*exchange(n), served_by=SERVED_BY)
    path = day_file(tmp_path, datetime.now(UTC))
    assert path.name == f"served-{datetime.now(UTC):%Y-%m-%d}.jsonl"
    assert [r["id"] for r in lines(path)] == ["chatcmpl-0", "chatcmpl-1", "chatcmpl-2"]
    items = list(iter_items([tmp_path]))
    assert all(isinstance(item, Trajectory) for item in items)
    first = items[0]
    assert first.task_id == "chatcmpl-0"  # the response id: what feedback joins on
    assert first.domain == "retail"
    assert first.messages[-1].role == "assistant"
    assert first.messages[-1].tool_calls[0].arguments == {"email": "user0@example.com"}
    assert first.tools[0].name == "find_user_id_by_email"
    assert first.metadata["served_by"]["version"] == "3"
    assert first.outcome.success is None


def test_the_request_names_the_domain_before_the_served_model(tmp_path: Path) -> None:
    traffic = ServedTraffic(tmp_path)
    model_only = {k: v for k, v in SERVED_BY.items() if k != "domain"}
    in_body, in_header = exchange(0), exchange(1)
    in_body[0]["metadata"] = {"domain": "airline", "user": "u1"}
    traffic.record(*in_body, served_by=SERVED_BY, domain="telecom")  # the body wins over the header
    traffic.record(*in_header, served_by=SERVED_BY, domain="telecom")
    traffic.record(*exchange(2), served_by=SERVED_BY, domain="  ")  # blank: the served model's
    odd = exchange(3)
    odd[0]["metadata"] = {"domain": 7}  # not a name: passed over
    traffic.record(*odd, served_by=model_only)
    items = {t.task_id: t for t in iter_items([tmp_path])}
    assert {k: t.domain for k, t in items.items()} == {
        "chatcmpl-0": "airline", "chatcmpl-1": "telecom", "chatcmpl-2": "retail", "chatcmpl-3": "unknown"}


def test_secrets_are_redacted_in_contents_and_tool_arguments(tmp_path: Path) -> None:
    key = "sk-proj-" + "a1B2" * 8
    arguments = json.dumps({"email": "jo@example.com", "token": f"Bearer {'x' * 24}"})
    request, response = exchange(0, content=f"my key is {key}, password=hunter22", arguments=arguments)
    ServedTraffic(tmp_path).record(request, response, served_by=SERVED_BY)
    text = day_file(tmp_path, datetime.now(UTC)).read_text()
    assert key not in text and "hunter22" not in text and "x" * 24 not in text
    record = json.loads(text)
    assert "[REDACTED]" in record["request"]["messages"][1]["content"]
    args = json.loads(record["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert args == {"email": "jo@example.com", "token": "[REDACTED]"}  # still JSON; e-mail kept by default
    assert request["messages"][1]["content"].startswith("my key is sk-proj-")  # the caller's dict untouched

    custom = ServedTraffic(tmp_path / "custom", redact=[EMAIL_PATTERN])
    custom.record(request, response, served_by=SERVED_BY)
    custom_text = day_file(tmp_path / "custom", datetime.now(UTC)).read_text()
    assert "jo@example.com" not in custom_text and key in custom_text  # only the listed patterns
    with pytest.raises(InputError, match="not a valid regex"):
        ServedTraffic(tmp_path, redact=["(unclosed"])


def test_disabled_traffic_writes_nothing(tmp_path: Path) -> None:
    traffic = ServedTraffic(tmp_path / "served", enabled=False)
    traffic.record(*exchange(0), served_by=SERVED_BY)
    assert not (tmp_path / "served").exists()
    with pytest.raises(UnknownResponseError):
        traffic.feedback("chatcmpl-0", success=True)


def test_feedback_lands_beside_the_day_file_and_survives_a_restart(tmp_path: Path) -> None:
    traffic = ServedTraffic(tmp_path)
    for n in range(2):
        traffic.record(*exchange(n), served_by=SERVED_BY)
    line = traffic.feedback("chatcmpl-0", success=True, note="refund done, key sk-" + "z" * 20)
    assert line["success"] is True and "[REDACTED]" in line["note"] and "time" in line
    # A restarted server finds ids recorded by an earlier process in the day files.
    restarted = ServedTraffic(tmp_path)
    restarted.feedback("chatcmpl-1", reward=0.25)
    restarted.feedback("chatcmpl-0", success=False)  # the last word wins
    side = outcomes_file(day_file(tmp_path, datetime.now(UTC)))
    assert side.name.endswith(".outcomes.jsonl") and len(lines(side)) == 3
    outcomes = load_outcomes(side)
    assert outcomes["chatcmpl-0"].success is False
    assert (outcomes["chatcmpl-1"].success, outcomes["chatcmpl-1"].reward) == (False, 0.25)
    with pytest.raises(UnknownResponseError, match="no served response has id 'chatcmpl-9'") as raised:
        restarted.feedback("chatcmpl-9", success=True)
    assert isinstance(raised.value, InputError)
    with pytest.raises(InputError, match="needs 'success'"):
        restarted.feedback("chatcmpl-0")
    with pytest.raises(InputError, match="'reward' must be a finite number"):
        restarted.feedback("chatcmpl-0", reward=float("nan"))


def test_threads_never_interleave_lines(tmp_path: Path) -> None:
    traffic = ServedTraffic(tmp_path)
    big = "x" * 70_000  # larger than a pipe buffer: a torn write would show

    def serve(worker: int) -> None:
        for i in range(20):
            traffic.record(*exchange(worker * 100 + i, content=big), served_by=SERVED_BY)
            traffic.feedback(f"chatcmpl-{worker * 100 + i}", success=i % 2 == 0)

    threads = [threading.Thread(target=serve, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log = day_file(tmp_path, datetime.now(UTC))
    assert len({r["id"] for r in lines(log)}) == 120
    assert len(load_outcomes(outcomes_file(log))) == 120


def test_a_line_cut_short_by_a_crash_costs_only_that_line(home: Path) -> None:
    served = home / "data" / "raw" / "served"
    traffic = ServedTraffic(served)
    traffic.record(*exchange(0), served_by=SERVED_BY)
    log = day_file(served, datetime.now(UTC))
    whole = json.dumps({"id": "chatcmpl-cut", "request": exchange(1)[0]})
    with open(log, "a") as handle:  # what a crash mid-write leaves: no newline
        handle.write(whole[: len(whole) // 2])
    ServedTraffic(served).record(*exchange(2), served_by=SERVED_BY)
    items = list(iter_items([served]))
    assert [i.task_id for i in items if isinstance(i, Trajectory)] == ["chatcmpl-0", "chatcmpl-2"]
    assert [i.record for i in items if isinstance(i, Rejected)] == [2]
    # The same for the feedback file: a cut line is one rejection, the others still join.
    traffic.feedback("chatcmpl-0", success=True)
    with open(outcomes_file(log), "a") as handle:
        handle.write('{"id": "chatcmpl-2", "succ')
    traffic.feedback("chatcmpl-2", reward=1.0)
    result = ingest_paths([home / "data" / "raw"], config.load(home), run_id="r1", workers=1)
    assert (result.read, result.accepted, result.quarantined) == (4, 2, 2)


def test_ingest_joins_feedback_and_reads_only_what_is_new(home: Path) -> None:
    served = home / "data" / "raw" / "served"
    traffic = ServedTraffic(served)
    for n in range(3):
        traffic.record(*exchange(n), served_by=SERVED_BY)
    traffic.feedback("chatcmpl-0", success=True)
    traffic.feedback("chatcmpl-1", reward=0.0)
    settings = config.load(home)
    first = ingest_paths([home / "data" / "raw"], settings, run_id="night1", workers=1)
    # The outcomes file is joined, not read as logs (no rejection for it).
    assert (first.read, first.accepted, first.quarantined) == (3, 3, 0)
    stored = {t.task_id: t.outcome.success for t in load_trajectories(settings.paths)}
    assert stored == {"chatcmpl-0": True, "chatcmpl-1": False, "chatcmpl-2": None}
    # The lineage manifest lists the feedback file right after the log it belongs to.
    log = day_file(served, datetime.now(UTC))
    assert [e["path"] for e in raw_files_manifest([home / "data" / "raw"], home)] == [
        f"data/raw/served/{log.name}", f"data/raw/served/{outcomes_file(log).name}"]
    # The day file grows; the next night adds only the new exchanges.
    for n in range(3, 5):
        traffic.record(*exchange(n), served_by=SERVED_BY)
    second = ingest_paths([home / "data" / "raw"], settings, run_id="night2", workers=2)
    assert (second.read, second.accepted, second.duplicates) == (5, 2, 3)


@pytest.mark.parametrize("workers", [1, 0])  # 0: Trajectory items through ingest_items, not file batches
def test_late_feedback_updates_the_stored_exchange_instead_of_adding_one(home: Path, workers: int) -> None:
    from traceops.ingest import ingest_items
    from traceops.store import CuratedStore

    served = home / "data" / "raw" / "served"
    settings = config.load(home)

    def night(name: str):  # noqa: ANN202 - the ingest result
        if workers:
            return ingest_paths([home / "data" / "raw"], settings, run_id=name, workers=workers)
        return ingest_items(iter_items([home / "data" / "raw"]), settings, run_id=name)

    def stored() -> dict[str, tuple]:
        return {t.task_id: (t.outcome.success, t.outcome.reward, t.id)
                for t in load_trajectories(settings.paths)}

    traffic = ServedTraffic(served)
    for n in range(3):
        traffic.record(*exchange(n), served_by=SERVED_BY)
    first = night("night1")
    assert (first.read, first.accepted, first.outcomes_updated) == (3, 3, 0)
    before = stored()
    assert {k: v[:2] for k, v in before.items()} == {f"chatcmpl-{n}": (None, None) for n in range(3)}

    # Feedback for yesterday's exchange and a new exchange arrive; the file is read again tonight.
    traffic.feedback("chatcmpl-1", success=True, reward=1.0)
    traffic.record(*exchange(3), served_by=SERVED_BY)
    second = night("night2")
    assert (second.read, second.accepted, second.duplicates, second.quarantined) == (4, 2, 2, 0)
    assert second.outcomes_updated == 1 and second.summary()["outcomes_updated"] == 1
    after = stored()
    assert CuratedStore(settings.paths).count() == 4 and len(after) == 4  # one trajectory per exchange
    assert after["chatcmpl-1"][:2] == (True, 1.0) and after["chatcmpl-1"][2] != before["chatcmpl-1"][2]
    assert after["chatcmpl-0"] == before["chatcmpl-0"] and after["chatcmpl-3"][:2] == (None, None)
    messages = {t.task_id: t.messages for t in load_trajectories(settings.paths)}
    assert messages["chatcmpl-1"][-1].tool_calls[0].arguments == {"email": "user1@example.com"}

    # The same again is all duplicates; a changed verdict (the last word wins) updates once more.
    again = night("night3")
    assert (again.read, again.accepted, again.duplicates, again.outcomes_updated) == (4, 0, 4, 0)
    traffic.feedback("chatcmpl-1", success=False, reward=0.0)
    third = night("night4")
    assert (third.accepted, third.duplicates, third.outcomes_updated) == (1, 3, 1)
    assert stored()["chatcmpl-1"][:2] == (False, 0.0) and CuratedStore(settings.paths).count() == 4

    # Another file holding the same response id is a different record: it is added, nothing replaced.
    copy = served / "copied.jsonl"
    copy.write_text(day_file(served, datetime.now(UTC)).read_text().splitlines()[0] + "\n")
    (served / "copied.outcomes.jsonl").write_text(json.dumps({"id": "chatcmpl-0", "success": True}) + "\n")
    fourth = night("night5")
    assert (fourth.accepted, fourth.outcomes_updated) == (1, 0) and CuratedStore(settings.paths).count() == 5


def test_feedback_endpoint_on_a_real_app(tmp_path: Path) -> None:
    traffic = ServedTraffic(tmp_path)
    traffic.record(*exchange(0), served_by=SERVED_BY)
    app = FastAPI()
    app.include_router(feedback_routes(traffic))
    client = TestClient(app)
    ok = client.post("/v1/feedback", json={"id": "chatcmpl-0", "success": True, "note": "resolved"})
    assert ok.status_code == 200
    assert ok.json()["recorded"]["id"] == "chatcmpl-0" and ok.json()["recorded"]["success"] is True
    unknown = client.post("/v1/feedback", json={"id": "chatcmpl-404", "reward": 1})
    assert unknown.status_code == 404 and "chatcmpl-404" in unknown.json()["error"]["message"]
    for body, says in [({"id": "chatcmpl-0"}, "needs 'success'"), ({"success": True}, "'id' is missing"),
                       ({"id": "chatcmpl-0", "success": "yes"}, "true or false"),
                       ({"id": "chatcmpl-0", "success": True, "score": 1}, "unknown field(s) score"),
                       ([1, 2], "must be a JSON object")]:
        answer = client.post("/v1/feedback", json=body)
        assert answer.status_code == 400, body
        assert says in answer.json()["error"]["message"] and '"id"' in answer.json()["error"]["message"]
    bad = client.post("/v1/feedback", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    assert len(lines(outcomes_file(day_file(tmp_path, datetime.now(UTC))))) == 1
