"""The task runner is a setting: mapped synthesis runs on a local Ray cluster started by the test and
gives the same environments as the in-process thread runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from traceops import config
from traceops.errors import ConfigError
from traceops.flows.runners import RunnerParams, task_runner

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "raw" / "sample" / "planted-retail.jsonl"
CAPABILITIES = ["argument_grounding", "policy_adherence"]
SMALL = {"train_size": 6, "val_size": 4, "test_size": 3}


def settings_with(home: Path, runner: dict[str, Any] | None) -> config.Settings:
    """Settings of a home whose params.yaml has this ``runner`` section."""
    if runner is not None:
        (home / "params.yaml").write_text(json.dumps({"runner": runner}))  # JSON is YAML
    return config.load(home)


def test_thread_runner_is_the_default(home: Path) -> None:
    from prefect.task_runners import ThreadPoolTaskRunner

    runner = task_runner(settings_with(home, None))
    assert isinstance(runner, ThreadPoolTaskRunner) and runner._max_workers == 1
    assert task_runner(settings_with(home, {"kind": "thread", "max_workers": 2}))._max_workers == 2


@pytest.mark.parametrize("section, message", [
    ({"kind": "dask"}, "runner.kind is 'dask'"),
    ({"kind": "thread", "max_workers": 0}, "max_workers is 0"),
    ({"kind": "thread", "workers": 2}, "unknown key(s) ['workers']"),
    ({"kind": "ray", "ray_address": 10001}, "ray_address must be"),
])
def test_bad_runner_settings_are_config_errors(home: Path, section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        task_runner(settings_with(home, section))
    assert message in str(err.value)


def test_ray_runner_settings(home: Path) -> None:
    pytest.importorskip("prefect_ray", reason="the ray extra is not installed: pip install 'traceops[ray]'")
    local = task_runner(settings_with(home, {"kind": "ray"}))
    assert local.address is None and local.init_kwargs["include_dashboard"] is False
    remote = task_runner(settings_with(home, {"kind": "ray", "ray_address": "ray://head:10001"}))
    assert remote.address == "ray://head:10001" and "include_dashboard" not in remote.init_kwargs
    assert RunnerParams.from_dict({"kind": "ray", "ray_init": {"num_cpus": 2}}).ray_init == {"num_cpus": 2}


def synthesize_mapped(runner: Any, out: Path) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """A real Prefect flow mapping traceops' synthesize over capabilities, one folder each, on ``runner``;
    returns each capability's manifest and folder hash, and the kinds of futures the runner handed out."""
    from prefect import flow, task, unmapped

    from traceops.envs.synthesize import synthesize
    from traceops.formats.detect import iter_items
    from traceops.schema import Trajectory

    trajectories = [t for t in iter_items([SAMPLE]) if isinstance(t, Trajectory)]
    synth = task(name="synthesize-capability")(synthesize)

    @flow(name="test-mapped-synthesize", task_runner=runner)
    def mapped() -> tuple[list[Any], set[str]]:
        futures = synth.map([[c] for c in CAPABILITIES], unmapped(trajectories),
                            [out / c for c in CAPABILITIES], unmapped(SMALL))
        return [f.result() for f in futures], {type(f).__name__ for f in futures}

    results, kinds = mapped()
    return {c: {"manifest": r.manifests[c], "env_hash": r.env_hash}
            for c, r in zip(CAPABILITIES, results, strict=True)}, kinds


@pytest.mark.slow
def test_mapped_synthesis_on_local_ray_equals_thread_runner(home: Path, tmp_path: Path) -> None:
    pytest.importorskip("prefect_ray", reason="the ray extra is not installed: pip install 'traceops[ray]'")
    import ray

    threaded, thread_kinds = synthesize_mapped(
        task_runner(settings_with(home, {"kind": "thread", "max_workers": 2})), tmp_path / "thread")
    # No address: RayTaskRunner starts a local cluster for the flow and shuts it down afterwards.
    on_ray, ray_kinds = synthesize_mapped(
        task_runner(settings_with(home, {"kind": "ray", "ray_init": {"num_cpus": 2}})), tmp_path / "ray")
    assert (thread_kinds, ray_kinds) == ({"PrefectConcurrentFuture"}, {"PrefectRayFuture"})
    assert not ray.is_initialized()
    for capability in CAPABILITIES:
        assert on_ray[capability]["manifest"] == threaded[capability]["manifest"]
        assert on_ray[capability]["env_hash"] == threaded[capability]["env_hash"]
        assert on_ray[capability]["manifest"]["self_tests"]["passed"]
        for split in ("train", "val", "test"):
            ray_file = tmp_path / "ray" / capability / capability / f"{split}.jsonl"
            assert ray_file.read_bytes() == (tmp_path / "thread" / capability / capability /
                                             f"{split}.jsonl").read_bytes()
