"""A production day end to end (issue 27): a night, the server serves its champion, the retail agent's
episodes go through the served endpoint, traffic and feedback land in data/raw/served/, a second night
ingests them and promotes, the server swaps without failing a request, `traceops rollback` swaps back,
and the lineage of the second champion reaches the served files.

Everything is the real thing on the tiny random-init Llama: the CLI in subprocesses (nights, serve,
rollback, lineage), uvicorn, our OpenAI-compatible client for the agent's episodes and the official
`openai` client for the traffic around the swaps.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_nightly_run import SAMPLE, write_parameters
from test_nightly_run import cli as nightly_cli

from traceops import config, registry
from traceops.collect import collect
from traceops.formats.openai import OpenAIReader
from traceops.schema import Trajectory
from traceops.serve import RELOAD_KEY_HEADER, VERSION_HEADER
from traceops.traffic import outcomes_file

# Two nights of real stages: about 10 minutes on an idle 2-core machine, far more on a shared one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]

NAME = registry.COMPOSITE_MODEL
RELOAD_ENV = "TRACEOPS_TEST_RELOAD_KEY"
RELOAD_KEY = "reload-secret-for-the-test"


def cli(home: Path, *args: str) -> tuple[int, dict, str]:
    """test_nightly_run's ``cli`` with room for a night on a loaded machine."""
    return nightly_cli(home, *args, timeout=2700)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def server(home: Path) -> Iterator[dict[str, Any]]:
    """A factory for `traceops serve` on the home (polling off: swaps happen on POST /v1/reload, so the
    test knows when); every started server is stopped at the end."""
    started: list[subprocess.Popen] = []

    def start() -> dict[str, Any]:
        port = free_port()
        env = {**os.environ, "TRACEOPS_HOME": str(home), "PREFECT_HOME": str(home / ".prefect"),
               RELOAD_ENV: RELOAD_KEY}
        log = open(home / f"serve-{port}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, "-m", "traceops", "serve", "--port", str(port),
                                 "--reload-key-env", RELOAD_ENV, "--poll-seconds", "0"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, (home / f"serve-{port}.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    return {"url": url, "proc": proc, "log": home / f"serve-{port}.log"}
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("traceops serve did not come up in 300 s")

    yield {"start": start}
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def fingerprint(url: str) -> str:
    """The version the default model (the champion) answers with, asked with the official client."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = client.chat.completions.with_raw_response.create(
        model=f"{NAME}@champion", messages=[{"role": "user", "content": "Hello"}], max_tokens=4)
    body = response.parse()
    assert response.headers[VERSION_HEADER] == body.system_fingerprint
    return str(body.system_fingerprint)


def reload_under_load(url: str, clients: int = 4) -> tuple[list[str], list[str], dict[str, Any]]:
    """POST /v1/reload while ``clients`` threads keep asking the champion with the official client:
    returns the fingerprints answered, the errors, and the reload's answer."""
    import openai

    stop = threading.Event()
    seen: list[str] = []
    errors: list[str] = []
    tools = [{"type": "function", "function": {"name": "get_order_details", "description": "Order status.",
                                               "parameters": {"type": "object", "properties": {
                                                   "order_id": {"type": "string"}}}}}]

    def ask(worker: int) -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        n = 0
        while not stop.is_set() or n < 2:
            n += 1
            try:
                answer = client.chat.completions.create(
                    model=f"{NAME}@champion", tools=tools, max_tokens=8,
                    messages=[{"role": "user", "content": f"Where is order #W{worker}{n}?"}])
                seen.append(str(answer.system_fingerprint))
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=ask, args=(w,)) for w in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    answer = httpx.post(f"{url}/v1/reload", headers={RELOAD_KEY_HEADER: RELOAD_KEY}, timeout=600)
    time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    assert answer.status_code == 200, answer.text
    return seen, errors, answer.json()


def first_user(messages: list[dict[str, Any]]) -> str:
    """An episode's first user turn: the task, which tells the episodes apart."""
    return next(str(m["content"]) for m in messages if m["role"] == "user")


def served_files(home: Path) -> list[Path]:
    return sorted((home / "data" / "raw" / "served").glob("served-*.jsonl"))


def test_a_production_day(home: Path, tiny_model_dir: Path, server: dict[str, Any], tmp_path: Path) -> None:
    (home / "data" / "raw").mkdir(parents=True)
    shutil.copy(SAMPLE, home / "data" / "raw" / SAMPLE.name)
    write_parameters(home, tiny_model_dir)
    params = yaml.safe_load((home / "params.yaml").read_text())
    # Test-sized evaluations cannot show a gain beyond chance: gates that let a second night's composite
    # replace the champion, so that the swap and the rollback have something to do.
    params["train"]["generic"] = False  # the generic LoRA is an evaluation baseline this test does not need
    params["promote"] = {"margin": -1.0, "max_capability_regression": 1.0, "min_paired_tasks": 1,
                         "repeat_failure_not_worse": False}
    (home / "params.yaml").write_text(yaml.safe_dump(params))

    # -- night 1 -------------------------------------------------------------------------------------
    code, first, err = cli(home, "run")
    assert code == 0, err
    registry.configure(config.load(home).paths)
    if not first["promoted"]:
        # The first night's gate wants a gain over the base that chance does not explain, which two
        # test tasks per capability never show: the operator promotes night 1's composite by hand.
        registry.promote_aliases(NAME, first["composite"]["version"], promoted=True)
    champion_1 = registry.get_alias(NAME, "champion")
    assert champion_1 is not None

    # -- the day: the server serves the champion; the retail agent works through it -------------------
    day = server["start"]()
    models = httpx.get(f"{day['url']}/v1/models").json()["data"]
    assert models[0]["traceops_default"] and models[0]["traceops_registered"]["version"] == champion_1.version
    assert fingerprint(day["url"]).startswith(f"{NAME}/{champion_1.version}:")
    episodes = collect("retail", f"{day['url']}/v1#{NAME}@champion", 4, tmp_path / "episodes", max_turns=2,
                       max_new_tokens=24, batch_size=4)
    assert episodes.episodes == 4
    trajectories = list(OpenAIReader().read(episodes.files[0]))
    assert all(isinstance(t, Trajectory) for t in trajectories)
    outcome_of = {first_user([m.model_dump() for m in t.messages]): t.outcome for t in trajectories}

    (log,) = served_files(home)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    agent_records = [r for r in records if first_user(r["request"]["messages"]) in outcome_of]
    assert len(agent_records) >= 4  # every episode's turns were served and logged
    assert all(r["metadata"]["served_by"]["version"] == champion_1.version for r in agent_records)
    for record in agent_records:  # the agent reports each episode's outcome on every response of it
        outcome = outcome_of[first_user(record["request"]["messages"])]
        answer = httpx.post(f"{day['url']}/v1/feedback",
                            json={"id": record["id"], "success": bool(outcome.success),
                                  "reward": outcome.reward, "note": "retail episode"})
        assert answer.status_code == 200, answer.text
    unknown = httpx.post(f"{day['url']}/v1/feedback", json={"id": "chatcmpl-never", "success": True})
    assert unknown.status_code == 404
    feedback = outcomes_file(log)
    assert len(feedback.read_text().splitlines()) == len(agent_records)

    # -- night 2 ingests the served traffic and its feedback, and promotes ------------------------------
    code, second, err = cli(home, "run")
    assert code == 0, err
    assert second["data_version"] != first["data_version"]
    assert second["promoted"] is True, second
    champion_2 = registry.get_alias(NAME, "champion")
    assert champion_2.version != champion_1.version
    from traceops.store import load_trajectories

    stored = {t.task_id: t for t in load_trajectories(config.load(home).paths)}
    for record in agent_records:  # every served exchange is in the curated data, its feedback joined
        assert stored[record["id"]].outcome.success is not None

    # The server swaps to the new champion under load: no request fails, both versions answered.
    seen, errors, reloaded = reload_under_load(day["url"])
    assert errors == [], errors[:3]
    assert any(c["to"] == champion_2.version for c in reloaded["changed"]), reloaded
    assert fingerprint(day["url"]).startswith(f"{NAME}/{champion_2.version}:")
    assert {s.split(":")[0] for s in seen} <= {f"{NAME}/{champion_1.version}", f"{NAME}/{champion_2.version}"}

    # The second champion's lineage reaches the served day file and its feedback.
    code, tree, err = cli(home, "lineage", f"{NAME}/{champion_2.version}")
    raw = {node["path"] for node in _nodes(tree["tree"]) if node["kind"] == "raw_file"}
    assert f"data/raw/served/{log.name}" in raw and f"data/raw/served/{feedback.name}" in raw, raw

    # -- rollback: champion back to night 1's, and the server follows -------------------------------
    code, rolled, err = cli(home, "rollback", "--reason", "production-day test: roll back night 2")
    assert code == 0, err
    assert rolled["champion"]["version"] == champion_1.version
    assert rolled["rolled_back"]["version"] == champion_2.version
    seen, errors, reloaded = reload_under_load(day["url"])
    assert errors == [], errors[:3]
    assert fingerprint(day["url"]).startswith(f"{NAME}/{champion_1.version}:")
    code, tree, err = cli(home, "lineage", f"{NAME}@champion")
    assert any(n["kind"] == "rollback" and "from version" in n["detail"] for n in _nodes(tree["tree"]))
    # Every request of the day, the swaps' included, is in the traffic log.
    assert sum(len(path.read_text().splitlines()) for path in served_files(home)) > len(records)


def _nodes(tree: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield tree
    for child in tree["children"]:
        yield from _nodes(child)
