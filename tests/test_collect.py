"""collect: runs written as OpenAI JSONL that ingest reads back; the bundled samples are reproducible."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceops.cli import app
from traceops.collect import collect, output_name
from traceops.config import load
from traceops.domains import get_domain
from traceops.domains.retail import KINDS
from traceops.errors import ConfigError
from traceops.formats.openai import OpenAIReader
from traceops.hashing import file_hash
from traceops.ingest import ingest_paths
from traceops.schema import Trajectory

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "raw" / "sample"
# How the bundled planted sample was made (`traceops collect`, see traceops.collect's docstring).
PLANTED_ARGS = ["--domain", "retail", "--model", "planted", "--tasks", "320", "--seed", "0", "--rates",
                '{"tool_call_format": 0.16, "argument_grounding": 0.15, "policy_adherence": 1.0, '
                '"error_recovery": 1.0}']


def _read(path: Path) -> list[Trajectory]:
    items = list(OpenAIReader().read(path))
    rejected = [item for item in items if not isinstance(item, Trajectory)]
    assert not rejected, rejected
    return items  # type: ignore[return-value]


@pytest.mark.slow  # ingest (Great Expectations suites) dominates: about 30 s on a quiet machine
def test_collect_planted_writes_ingestible_labelled_logs(home: Path) -> None:
    result = collect("retail", "planted", 40, home / "raw", seed=2,
                     planted_rates={"policy_adherence": 1.0, "tool_selection": 0.3})
    assert result.episodes == 40 and 0 < result.succeeded < 40
    assert result.files == [home / "raw" / "planted-retail.jsonl"]
    trajectories = _read(result.files[0])
    assert sum(t.outcome.success for t in trajectories) == result.succeeded
    labelled = [t for t in trajectories if t.labels]
    assert labelled and all(not t.outcome.success for t in labelled)
    planted = {label.capability for t in labelled for label in t.labels}
    assert planted == {"policy_adherence", "tool_selection"}
    ingested = ingest_paths([result.files[0]], load(home), run_id="collect-test", fmt="openai")
    assert (ingested.read, ingested.accepted, ingested.quarantined) == (40, 40, 0)


def test_output_names_and_bad_specs(home: Path) -> None:
    assert output_name("embedded", "retail") == "embedded-retail.jsonl"
    assert output_name("/models/my-agent/", "retail") == "my-agent-retail.jsonl"
    assert output_name("http://host:8000/v1#qwen", "retail") == "qwen-retail.jsonl"
    with pytest.raises(ConfigError, match="unknown domain"):
        collect("airline", "planted", 2, home)
    with pytest.raises(ConfigError, match="only apply to --model planted"):
        collect("retail", "embedded", 2, home, planted_rates={"tool_selection": 0.5})


@pytest.mark.slow
def test_bundled_planted_sample_is_reproducible(tmp_path: Path) -> None:
    bundled = SAMPLE / "planted-retail.jsonl"
    out = CliRunner().invoke(app, ["collect", *PLANTED_ARGS, "--out", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 320
    assert file_hash(tmp_path / "planted-retail.jsonl") == file_hash(bundled)
    trajectories = _read(bundled)
    outcomes = Counter(t.outcome.success for t in trajectories)
    assert len(trajectories) >= 300 and outcomes[True] >= 100 and outcomes[False] >= 100
    capabilities = Counter(label.capability for t in trajectories for label in t.labels)
    assert len(capabilities) >= 4 and all(count >= 10 for count in capabilities.values())
    assert bundled.stat().st_size < 5_000_000


def test_bundled_embedded_sample_reads_as_real_runs() -> None:
    path = SAMPLE / "embedded-retail.jsonl"
    trajectories = _read(path)
    domain = get_domain("retail")
    # Every task of the domain, once (the issue: the embedded model's real runs over all domain tasks).
    assert sorted(t.task_id for t in trajectories) == sorted(task.id for task in domain.tasks())
    assert len(domain.tasks()) >= len(KINDS)
    assert {t.agent for t in trajectories} == {"HuggingFaceTB/SmolLM2-135M-Instruct"}
    assert all(t.outcome.reward is not None and not t.labels for t in trajectories)


@pytest.mark.slow  # one batch of 16 episodes of the embedded model, about 15 s
def test_bundled_embedded_sample_is_reproducible(tmp_path: Path) -> None:
    # The bundled file's settings (traceops.collect's docstring), on its first batch of tasks: greedy
    # decoding makes the runs a function of the weights and the tasks.
    result = collect("retail", "embedded", 16, tmp_path, max_turns=2, max_new_tokens=48, batch_size=16)
    fresh = result.files[0].read_text(encoding="utf-8").splitlines()
    bundled = (SAMPLE / "embedded-retail.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(fresh) == 16 and fresh == bundled[:16]
