"""The route stage end to end: a real Prefect run of ``route_flow`` in a temp home (real MLflow store and
registry) over two synthesized capabilities whose adapters (random LoRA weights on the random-init tiny
Llama, saved as training saves them) are registered first; the flow finds them in the registry, fits the
routers, saves and registers router and composite; a rerun is served from the cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from random_adapters import random_adapter

from traceops import config, registry
from traceops.errors import ConfigError
from traceops.lineage import current_lineage
from traceops.mlflow_models.registration import register_adapter
from traceops.tags import LINEAGE_KEYS, TAG_PARENT_VERSIONS, TAG_REUSED_RUN, TAG_ROUTE_KEY, TAG_SOURCE_RUN

CAPS = ["argument_grounding", "tool_call_format"]
# Token routing over top-2 (the nightly default is request top-1): the test covers the token mode.
ROUTE = {"top_k": 2, "mode": "token", "steps": 4, "batch_size": 4, "max_length": 96, "train_examples": 5,
         "val_examples": 2, "learning_rate": 5e-2}


@pytest.fixture()
def route_home(home: Path, tiny_model_dir: Path) -> Path:
    """A home with two synthesized capabilities and a registered adapter for each."""
    import mlflow

    from traceops.envs.synthesize import synthesize
    from traceops.flows.runtime import prepare

    (home / "params.yaml").write_text(yaml.safe_dump({"route": ROUTE}))
    paths = prepare(home).paths
    assert synthesize(CAPS, [], paths.environments, {"train_size": 5, "val_size": 2, "test_size": 2}).passed
    lineage = current_lineage(paths, str(tiny_model_dir), diagnosis_run="")
    for seed, cap in enumerate(CAPS, start=1):
        folder = random_adapter(tiny_model_dir, home / "trained" / cap, seed)
        with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "train")):
            register_adapter(folder, cap, lineage, base_model=str(tiny_model_dir))
    return home


def logits(model: object, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # type: ignore[operator]


@pytest.mark.slow
def test_route_flow_fits_registers_reloads_and_caches(route_home: Path, tiny_model_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from traceops.flows.route import route_flow
    from traceops.moe import build_moe, load_moe, read_config

    home = route_home
    paths = config.load(home).paths
    result = route_flow(home=str(home), base_model=str(tiny_model_dir))

    adapters = {registry.adapter_model_name(c): "1" for c in CAPS}
    assert result.router.model_dump() == {"name": registry.ROUTER_MODEL, "version": "1"}
    assert result.composite.model_dump() == {"name": registry.COMPOSITE_MODEL, "version": "1"}
    assert result.parent_versions == {**adapters, registry.ROUTER_MODEL: "1"}
    composite_dir = Path(result.composite_path)
    assert composite_dir == paths.models / "composite"
    info = json.loads((composite_dir / "composite.json").read_text())
    assert {c: (e["model_name"], e["model_version"]) for c, e in info["experts"].items()} == {
        c: (registry.adapter_model_name(c), "1") for c in CAPS}
    assert info["top_k"] == 2 and info["mode"] == "token"
    assert (composite_dir / "chat_template.jinja").is_file() or "chat_template" in json.loads(
        (composite_dir / "tokenizer_config.json").read_text())

    # One MLflow stage run: fit curves, accuracy per capability, the val routing summary and artifact.
    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    run = client.get_run(result.mlflow_run)
    assert run.data.tags["traceops.stage"] == "route"
    for part in ("total", "route", "lm", "balance", "z"):
        history = client.get_metric_history(run.info.run_id, f"fit_{part}_loss")
        assert [m.step for m in history] == [1, 2, 3, 4]
    # The fit showed its progress: every block's probe fitted (2 layers), then optimizer step s of S.
    printed = capsys.readouterr().err
    assert "route 2 experts: probe step 2/2, elapsed " in printed
    assert "route 2 experts: fit step 4/4, elapsed " in printed
    metrics = run.data.metrics
    for cap in CAPS:
        assert 0.0 <= metrics[f"routing_accuracy.{cap}"] <= 1.0
        shares = [metrics[f"val_share.{cap}.{name}"] for name in [*CAPS, "null"]]
        assert sum(shares) == pytest.approx(1.0, abs=1e-4)
        assert result.routing["val"][cap]["tokens"] > 0
    routing_doc = json.loads(Path(client.download_artifacts(run.info.run_id, "routing.json",
                                                            str(home / "dl"))).read_text())
    assert set(routing_doc["val_routing"]) == set(CAPS) and len(routing_doc["fit"]["losses"]["route"]) == 4

    # Registered versions carry the lineage and their parents.
    router_tags = client.get_model_version(registry.ROUTER_MODEL, "1").tags
    composite_tags = client.get_model_version(registry.COMPOSITE_MODEL, "1").tags
    assert json.loads(router_tags[TAG_PARENT_VERSIONS]) == adapters
    parents = json.loads(composite_tags[TAG_PARENT_VERSIONS])
    assert parents == {**adapters, registry.ROUTER_MODEL: "1"}
    assert all(key in composite_tags for key in LINEAGE_KEYS)
    assert composite_tags[TAG_SOURCE_RUN] == result.mlflow_run

    # The registered composite = the registered adapters + the fitted routers: rebuilding it from the
    # adapter versions and the saved router weights gives the reloaded composite's logits exactly.
    registered = registry.download(registry.get_version(registry.COMPOSITE_MODEL, "1"), home / "composite-dl")
    reloaded = load_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval(), registered)
    folders = {c: registry.download(registry.get_version(registry.adapter_model_name(c), "1"), home / "a" / c)
               for c in CAPS}
    saved = read_config(registered)
    rebuilt = build_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval(), folders,
                        top_k=saved.top_k, router_seed=saved.router_seed)
    routers = load_file(str(registered / "moe_model.safetensors"))
    fitted_differs = False
    with torch.no_grad():
        for path, router in rebuilt.routers.items():
            fitted_differs |= not torch.equal(router.proj.weight, routers[f"router.{path}.weight"])
            router.proj.weight.copy_(routers[f"router.{path}.weight"])
    assert fitted_differs  # the routers moved away from their seeded init
    ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(logits(reloaded, ids), logits(rebuilt, ids), rtol=0, atol=1e-6)
    local = load_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval(), composite_dir)
    assert torch.equal(logits(local, ids), logits(reloaded, ids))

    # Unchanged inputs: served from the cache, no new run, no new version.
    again = route_flow(home=str(home), base_model=str(tiny_model_dir))
    assert again.mlflow_run == result.mlflow_run and again.composite == result.composite
    assert registry.latest_version(registry.COMPOSITE_MODEL).version == "1"

    # Another top-k is another composite: refitted and registered as version 2 of both.
    other = route_flow(home=str(home), base_model=str(tiny_model_dir), top_k=1)
    assert other.mlflow_run != result.mlflow_run
    assert other.composite.version == "2" and other.parent_versions[registry.ROUTER_MODEL] == "2"
    assert read_config(composite_dir).top_k == 1

    # Base-routing samples are kept for the next fit under models/route_probes: in token mode the held-out
    # decision prompts' alone (its probes read states under each adapter), in request mode the probes' too.
    assert len(list((paths.models / "route_probes").glob("*.safetensors"))) == len(CAPS)
    request = route_flow(home=str(home), base_model=str(tiny_model_dir), mode="request")
    assert request.composite.version == "3"
    assert len(list((paths.models / "route_probes").glob("*.safetensors"))) == 2 * len(CAPS)


def test_route_params_from_params_yaml_refuse_unknown_keys(home: Path) -> None:
    from traceops.moe import RouteConfig

    (home / "params.yaml").write_text(yaml.safe_dump({"route": {"top_k": 3, "stepz": 5}}))
    with pytest.raises(ConfigError, match="stepz"):
        RouteConfig.from_params(config.load(home).stage("route"))
    (home / "params.yaml").write_text(yaml.safe_dump({"route": {"top_k": 3, "steps": 5}}))
    params = RouteConfig.from_params(config.load(home).stage("route"), {"batch_size": 2}, mode="token")
    assert params.to_dict() == {**RouteConfig().to_dict(), "top_k": 3, "steps": 5, "batch_size": 2,
                                "mode": "token"}


@pytest.mark.slow
def test_route_rerun_after_lost_result_or_folder_reuses_the_registered_versions(
    route_home: Path, tiny_model_dir: Path
) -> None:
    """A route attempt killed after registering (before Prefect stored its result) must not register a
    second router and composite when rerun; a lost composite folder is restored from the registry."""
    from mlflow.tracking import MlflowClient

    from traceops.flows.route import route_flow
    from traceops.hashing import folder_hash
    from traceops.tasks.route import route_task

    home = route_home
    paths = config.load(home).paths
    first = route_flow(home=str(home), base_model=str(tiny_model_dir))
    composite_dir = Path(first.composite_path)
    fitted_hash = folder_hash(composite_dir)
    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    assert client.get_model_version(registry.COMPOSITE_MODEL, "1").tags[TAG_ROUTE_KEY] == first.key

    # The folder is gone: the cached result is not trusted, the task reruns and restores the folder.
    import shutil

    shutil.rmtree(composite_dir)
    restored = route_flow(home=str(home), base_model=str(tiny_model_dir))
    assert folder_hash(composite_dir) == fitted_hash

    # No Prefect result at all (the task body runs again): still the same versions, nothing refitted.
    rerun = route_task.fn(key=first.key, adapters=[
        {"capability": c, "model_name": registry.adapter_model_name(c), "model_version": "1"} for c in CAPS],
        home=str(home), params={**ROUTE}, base_model=str(tiny_model_dir))
    for again in (restored, rerun):
        assert again.router == first.router and again.composite == first.composite
        assert again.parent_versions == first.parent_versions
        assert again.mlflow_run == first.mlflow_run  # the run that fitted (metrics, routing.json)
        assert again.routing == first.routing
    for name in (registry.ROUTER_MODEL, registry.COMPOSITE_MODEL):
        assert [str(v.version) for v in client.search_model_versions(f"name = '{name}'")] == ["1"]
    reusing = client.search_runs([client.get_experiment_by_name(registry.experiment_name("route"))
                                  .experiment_id], f"tags.`{TAG_REUSED_RUN}` = '{first.mlflow_run}'")
    assert len(reusing) == 2 and all(r.info.status == "FINISHED" for r in reusing)


def one_capability_home(home: Path, tiny_model_dir: Path, route: dict[str, Any]) -> tuple[Any, Path]:
    """A home with ``route`` settings, CAPS[0] synthesized and a random adapter registered for it;
    returns its paths and the adapter folder."""
    import mlflow

    from traceops.envs.synthesize import synthesize
    from traceops.flows.runtime import prepare

    (home / "params.yaml").write_text(yaml.safe_dump({"route": route}))
    paths = prepare(home).paths
    cap = CAPS[0]
    assert synthesize([cap], [], paths.environments, {"train_size": 5, "val_size": 2, "test_size": 2}).passed
    folder = random_adapter(tiny_model_dir, home / "trained" / cap, seed=3)
    with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "train")):
        register_adapter(folder, cap, current_lineage(paths, str(tiny_model_dir), diagnosis_run=""),
                         base_model=str(tiny_model_dir))
    return paths, folder


@pytest.mark.slow
def test_a_single_capability_composite_is_its_adapter_with_no_router_fitted(home: Path,
                                                                             tiny_model_dir: Path) -> None:
    """One selected capability: the composite routes every token to its one expert (no null expert, no
    fit, no trace) and computes what the PEFT adapter computes."""
    from mlflow.tracking import MlflowClient
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from traceops.flows.route import route_flow
    from traceops.moe import load_moe, read_config

    paths, folder = one_capability_home(home, tiny_model_dir, ROUTE)
    cap = CAPS[0]
    result = route_flow(home=str(home), base_model=str(tiny_model_dir))
    composite_dir = Path(result.composite_path)
    saved = read_config(composite_dir)
    assert (list(saved.experts), saved.top_k, saved.null_expert) == ([cap], 1, False)
    assert json.loads((composite_dir / "composite.json").read_text())["fit"] is None
    run = MlflowClient(paths.mlflow_uri, paths.mlflow_uri).get_run(result.mlflow_run)
    assert run.data.metrics["experts"] == 1.0 and "fit_seconds" not in run.data.metrics
    assert result.composite.version == "1" and result.routing == {"experts": 1.0, "val": {}}

    composite = load_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval(), composite_dir)
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                                        str(folder)).eval()
    ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(logits(composite, ids), logits(adapter, ids), rtol=1e-4, atol=1e-4)


def logged_run(index: int, success: bool, agent: str) -> Any:
    """A single-turn logged request of the base: a weather question it declined right (success), or an
    order look-up it got wrong (failure)."""
    from traceops.schema import Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

    tools = [ToolSpec(name="get_order_details", description="Read an order",
                      parameters={"type": "object", "properties": {"order_id": {"type": "string"}},
                                  "required": ["order_id"]})]
    if success:
        messages = [Message(role="user", content=f"What's the weather like in Nairobi on day {index}?"),
                    Message(role="assistant", content="Sorry, I can only help with orders.")]
    else:
        messages = [Message(role="user", content=f"Where is my order #W{2000000 + index:07d}?"),
                    Message(role="assistant", tool_calls=[ToolCall(id="c", name="get_order",
                                                                   arguments={"id": "order"})])]
    return Trajectory(task_id=f"t{index}", domain="shop", agent=agent, tools=tools, messages=messages,
                      outcome=Outcome(success=success),
                      source=Source(format="openai", file="logs.jsonl", record=index))


def keep_base_home(home: Path, tiny_model_dir: Path, runs: list[Any]) -> Any:
    """A one-capability home asking for keep-base routing, with a registered adapter, the logged ``runs``
    curated and their failures blamed on the capability; returns its paths."""
    import pandas as pd

    from traceops.store import append_trajectories

    route = {**ROUTE, "mode": "request", "top_k": 1, "steps": 0, "keep_base": True}
    paths, _folder = one_capability_home(home, tiny_model_dir, route)
    cap = CAPS[0]
    append_trajectories(paths, runs)
    paths.diagnosis.mkdir(parents=True, exist_ok=True)
    blamed = [{"trajectory_id": t.id, "task_id": t.task_id, "capability": cap}
              for t in runs if not t.outcome.succeeded]
    pd.DataFrame(blamed).to_parquet(paths.diagnosis / "attributions.parquet")
    return paths


@pytest.mark.slow
def test_keep_base_gives_a_single_capability_composite_a_router_that_sends_the_bases_successes_to_it(
        home: Path, tiny_model_dir: Path) -> None:
    """route.keep_base on a one-capability night: the base model's logged successes (train side) teach
    the request decision to leave them to the base; the draw is part of the cache key."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from traceops.flows.route import route_flow
    from traceops.heldout import is_heldout
    from traceops.keep_base import decision_row
    from traceops.moe import load_moe, read_config
    from traceops.store import append_trajectories

    cap = CAPS[0]
    runs = [logged_run(i, success=i % 2 == 0, agent=tiny_model_dir.name) for i in range(160)]
    paths = keep_base_home(home, tiny_model_dir, runs)

    result = route_flow(home=str(home), base_model=str(tiny_model_dir))
    composite_dir = Path(result.composite_path)
    saved = read_config(composite_dir)
    assert (list(saved.experts), saved.top_k, saved.null_expert) == ([cap], 1, True)
    verdict = json.loads((composite_dir / "composite.json").read_text())["keep_base"]
    assert verdict["kept"] is True, verdict
    train_side = [t for t in runs if not is_heldout(t.task_id, 0, 0.2)]
    for target, won in ((cap, False), ("null", True)):  # every train-side run drawn (256 per target at most)
        count = sum(t.outcome.succeeded is won for t in train_side)
        assert verdict["train_prompts"][target] + verdict["heldout_prompts"][target] == count
    # A held-out success (never drawn) is left to the base; a held-out failure goes to the adapter.
    tokenizer = AutoTokenizer.from_pretrained(str(composite_dir))
    composite = load_moe(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval(), composite_dir)
    held = [t for t in runs if is_heldout(t.task_id, 0, 0.2)]
    for trajectory in held[:6]:
        row = decision_row(trajectory)
        ids = tokenizer.apply_chat_template(row["messages"][:-1], tools=json.loads(row["tools"]),
                                            tokenize=True, add_generation_prompt=True, return_dict=True)
        chosen = int(composite.request_gates(torch.tensor([ids["input_ids"]]))[0].argmax())
        assert (chosen == 1) is trajectory.outcome.succeeded, trajectory.task_id  # 1: the null expert
    # A new train-side logged success is a new draw: the composite is fitted again.
    index = next(i for i in range(1000, 1100, 2) if not is_heldout(f"t{i}", 0, 0.2))
    append_trajectories(paths, [logged_run(index, success=True, agent=tiny_model_dir.name)])
    again = route_flow(home=str(home), base_model=str(tiny_model_dir))
    assert again.key != result.key and again.composite.version == "2"


@pytest.mark.slow
def test_keep_base_with_too_few_logged_successes_of_the_base_fits_nothing(home: Path,
                                                                          tiny_model_dir: Path) -> None:
    """The base logged 4 successes (as on the retail sample) and another agent many: too few to fit and
    check, said before any forward pass; the one-capability composite stays its adapter alone."""
    from traceops.flows.route import route_flow
    from traceops.moe import read_config

    runs = [logged_run(i, success=i < 8, agent=tiny_model_dir.name) for i in range(60)]
    runs += [logged_run(100 + i, success=True, agent="traceops/planted-gap-agent") for i in range(60)]
    keep_base_home(home, tiny_model_dir, runs)
    result = route_flow(home=str(home), base_model=str(tiny_model_dir))
    composite_dir = Path(result.composite_path)
    assert (read_config(composite_dir).null_expert, result.routing) == (False, {"experts": 1.0, "val": {}})
    info = json.loads((composite_dir / "composite.json").read_text())
    assert info["fit"] is None and info["keep_base"]["kept"] is False
    assert "keep-base routing needs 38" in info["keep_base"]["reason"], info["keep_base"]
