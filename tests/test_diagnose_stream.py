"""Streaming diagnosis: the curated store read back in tiny batches gives the same diagnosis as the list.

The bundled sample (planted and embedded retail episodes) goes into a real curated store; diagnosis
then streams it through ``store.load_trajectories`` a few trajectories at a time and must give the
same capabilities.json, attributions.parquet and report.html as diagnosing all of it at once.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path

import pytest

import traceops.domains
from traceops import config
from traceops.diagnose.clustering import ClusterParams
from traceops.diagnose.outputs import write_outputs
from traceops.diagnose.run import DiagnoseParams, Diagnosis, diagnose
from traceops.errors import StageError
from traceops.formats import iter_items
from traceops.schema import Trajectory
from traceops.store import append_trajectories, load_trajectories

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "raw" / "sample"


def _files(d: Diagnosis, folder: Path) -> dict[str, bytes]:
    """The three output files, without the labelers' wall-clock seconds (the one run-dependent field)."""
    paths = write_outputs(d, folder)
    body = json.loads(paths["capabilities"].read_text())
    for cost in body["labeler_costs"].values():
        cost.pop("seconds")
    return {"capabilities": json.dumps(body).encode(), "attributions": paths["attributions"].read_bytes(),
            "report": paths["report"].read_bytes()}


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Trajectory], config.Paths]:
    """The bundled sample, deduplicated, in a real curated store; the trajectories in store order."""
    home = tmp_path_factory.mktemp("home")
    paths = config.load(str(home)).paths
    new_ids, _ = append_trajectories(paths, iter_items(sorted(SAMPLE.glob("*.jsonl"))))
    trajectories = list(load_trajectories(paths))
    assert len(trajectories) == len(new_ids) > 300
    return trajectories, paths


@pytest.mark.parametrize(
    ("params", "labelers"),
    [
        (DiagnoseParams(clusters=ClusterParams(backend="tfidf", max_points=60)), ("rule",)),
        (DiagnoseParams(combine="any", embedding_backend="tfidf", examples_per_capability=2,
                        clusters=ClusterParams(backend="tfidf")), ("rule", "embedding")),
    ],
)
def test_store_streamed_in_tiny_batches_gives_the_same_diagnosis(stored, tmp_path: Path, params,
                                                                 labelers) -> None:
    trajectories, paths = stored
    whole = diagnose(trajectories, params, labelers=labelers, seed=0, replay_fn=traceops.domains.replay_fn)

    requests: list[Collection[str] | None] = []

    def source(ids: Collection[str] | None) -> Iterable[Trajectory]:
        requests.append(None if ids is None else set(ids))
        return load_trajectories(paths, ids)

    streamed = diagnose(source, params, labelers=labelers, seed=0, replay_fn=traceops.domains.replay_fn,
                        batch_size=7)
    assert _files(streamed, tmp_path / "streamed") == _files(whole, tmp_path / "whole")
    assert streamed.counts == whole.counts and streamed.counts["trajectories"] == len(trajectories)
    assert whole.clustering is not None and not whole.clustering.points.empty  # clustering was exercised
    assert any(a.counterfactual_flip is not None for a in streamed.attributions)  # and replay
    # One full pass, then a second one for the failures still needed (replays, segments, examples) only.
    assert requests[0] is None and len(requests) == 2
    assert requests[1] <= {a.trajectory_id for a in whole.attributions}


def test_one_shot_iterator_and_empty_input() -> None:
    trajectories = list(iter_items([SAMPLE / "planted-retail.jsonl"]))[:60]
    params = DiagnoseParams(cluster=False)
    from_list = diagnose(trajectories, params, batch_size=8)
    from_iterator = diagnose(iter(trajectories), params, batch_size=8)
    assert from_iterator.capabilities_json()["scores"] == from_list.capabilities_json()["scores"]
    assert from_iterator.attributions == from_list.attributions
    empty = diagnose([], params)
    assert empty.counts["trajectories"] == 0 and empty.selected == [] and empty.attributions == []


def test_a_store_that_changes_between_the_passes_is_reported() -> None:
    trajectories = list(iter_items([SAMPLE / "planted-retail.jsonl"]))[:60]

    def replaced_store(ids: Collection[str] | None) -> Iterable[Trajectory]:
        return trajectories if ids is None else trajectories[:10]  # most failures gone on the second read

    with pytest.raises(StageError, match="changed while it was diagnosed"):
        diagnose(replaced_store, DiagnoseParams(cluster=False), batch_size=16)
