"""The ``traceops`` command. Every command takes ``--json`` and then prints one JSON object as its last line.

Heavy imports (Prefect, MLflow, torch) happen inside commands, after ``flows.runtime.prepare`` has pointed
Prefect at the home: Prefect reads ``PREFECT_HOME`` when imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from traceops.errors import ConfigError, TraceopsError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Turn an agent's recurring failures into capability-targeted training.")
console = Console(stderr=True)


@app.callback()
def _main() -> None:
    """traceops: every night, from failure logs to a promoted, auditable model."""


def emit(result: dict[str, Any], as_json: bool, table_title: str | None = None) -> None:
    """Print a result: a readable table, or with --json one JSON object as the last line of stdout."""
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
        sys.stdout.flush()
        return
    from rich.table import Table

    table = Table(title=table_title, show_header=False)
    for key, value in result.items():
        table.add_row(str(key), value if isinstance(value, str) else json.dumps(value, default=str))
    Console().print(table)


def fail(exc: Exception, as_json: bool) -> None:
    """Report a traceops error clearly and exit non-zero (a JSON error object with --json)."""
    if as_json:
        sys.stdout.write(json.dumps({"error": str(exc), "type": type(exc).__name__}) + "\n")
    console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(code=2)


@app.command()
def ingest(
    paths: list[Path] = typer.Argument(..., help="Log files or folders to ingest."),
    fmt: str = typer.Option("auto", "--format", help="auto|openai|tau2|swe|otel"),
    outcomes: Path | None = typer.Option(None, "--outcomes", help="Side file mapping task ids to outcomes."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Read production logs, validate them, store new trajectories and version the curated data."""
    from traceops.flows import runtime

    try:
        from traceops.formats.detect import check_format, check_paths

        check_format(fmt)
        check_paths(paths)  # fail before any flow starts when a path is missing
        settings = runtime.prepare(home)
        from traceops.flows.ingest import ingest_flow

        with runtime.home_lock(settings):
            result = ingest_flow(paths=[str(p) for p in paths], fmt=fmt,
                                 outcomes=str(outcomes) if outcomes else None, home=str(settings.paths.home))
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    emit(result.model_dump(mode="json"), as_json, "ingest")


LABELER_SETS = {"offline": ("rule",), "llm": ("rule", "llm")}


@app.command()
def collect(
    domain: str = typer.Option("retail", "--domain", help="Bundled domain to run in."),
    model: str = typer.Option("embedded", "--model", help="embedded | planted | a folder | http(s)://host/v1#model"),
    tasks: int | None = typer.Option(None, "--tasks", help="How many of the domain's tasks (default: all)."),
    out: Path = typer.Option(..., "--out", help="Folder for <model>-<domain>.jsonl."),
    seed: int = typer.Option(0, "--seed"),
    rates: str | None = typer.Option(None, "--rates", help='Planted rates: {"tool_selection": 0.2}'),
    max_turns: int = typer.Option(12, "--max-turns"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    batch_size: int = typer.Option(8, "--batch-size", help="Episodes generated together."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Run a model over a domain's tasks and write OpenAI-chat JSONL logs, ready for `traceops ingest`."""
    from rich.progress import Progress

    from traceops.collect import collect as run_collect
    from traceops.collect import parse_rates

    try:
        with Progress(console=console, transient=True, disable=as_json) as bar:
            job = bar.add_task("episodes", total=tasks)
            result = run_collect(domain, model, tasks, out, seed=seed, planted_rates=parse_rates(rates),
                                 max_turns=max_turns, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                 progress=lambda n: bar.update(job, completed=n))
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    summary = result.as_dict()
    emit({"episodes": summary["episodes"], "succeeded": summary["succeeded"], "out": summary["out"]},
         as_json, "collect")


@app.command()
def diagnose(
    labelers: str = typer.Option("offline", "--labelers", help="offline (rule-based) | llm (rule + LLM)"),
    llm_model: str | None = typer.Option(None, "--llm-model",
                                         help="LLM labeler model: http(s)://host/v1#model or a folder."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Find the capability gaps behind recurring failures; write capabilities.json and report.html."""
    from traceops.flows import runtime

    try:
        if labelers not in LABELER_SETS:
            raise ConfigError(f"--labelers must be one of {sorted(LABELER_SETS)}, got '{labelers}'")
        if labelers == "llm" and not llm_model:
            raise ConfigError("--labelers llm needs --llm-model (an OpenAI-compatible URL#model or a folder)")
        settings = runtime.prepare(home)
        from traceops.flows.diagnose import diagnose_flow

        with runtime.home_lock(settings):
            result = diagnose_flow(home=str(settings.paths.home), labelers=LABELER_SETS[labelers],
                                   llm_model=llm_model)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    emit(result.model_dump(mode="json", include={"selected", "report"}), as_json, "diagnose")


@app.command()
def synthesize(
    capability: list[str] | None = typer.Option(None, "--capability", help="Only these capabilities."),
    n_train: int | None = typer.Option(None, "--n-train", help="Training tasks per capability."),
    calibrate: str | None = typer.Option(None, "--calibrate",
                                         help="Measure this model's success per level (e.g. embedded)."),
    llm: str | None = typer.Option(None, "--llm", help="An OpenAI-compatible model (URL#model) that "
                                   "rewrites requests in prose; a rewrite is kept only if every value "
                                   "survives (default: offline requests)."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Generate verifiable training environments for the diagnosed capabilities; version them with DVC."""
    from traceops.flows import runtime

    try:
        if n_train is not None and n_train < 1:
            raise ConfigError(f"--n-train must be at least 1, got {n_train}")
        settings = runtime.prepare(home)
        from traceops.flows.synthesize import synthesize_flow

        with runtime.home_lock(settings):
            overrides = {**({"train_size": n_train} if n_train else {}), **({"llm": llm} if llm else {})}
            result = synthesize_flow(home=str(settings.paths.home), capabilities=capability or None,
                                     calibrate_model=calibrate, overrides=overrides or None)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    shown = {"environments", "env_version", "skipped"}
    emit(result.model_dump(mode="json", include=shown), as_json, "synthesize")


def _stage_flow(home: Path | None, flow_module: str, flow_name: str, **kwargs: Any) -> Any:
    """Prepare the home, take its lock and run one stage flow in process."""
    import importlib

    from traceops.flows import runtime

    settings = runtime.prepare(home)
    stage_flow = getattr(importlib.import_module(flow_module), flow_name)
    with runtime.home_lock(settings):
        return stage_flow(home=str(settings.paths.home), **kwargs)


@app.command()
def train(
    capability: list[str] | None = typer.Option(None, "--capability", help="Only these capabilities."),
    all_: bool = typer.Option(False, "--all", help="Every capability in data/environments (the default)."),
    budget: str | None = typer.Option(None, "--budget", help="tiny | small | full (default: params.yaml)."),
    base_model: str | None = typer.Option(None, "--base-model", help="embedded or a local model folder."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Train one LoRA adapter per capability (SFT warm-start, then GRPO) and register each in MLflow."""
    try:
        if capability and all_:
            raise ConfigError("pass either --capability (repeatable) or --all, not both")
        result = _stage_flow(home, "traceops.flows.train", "train_flow", capabilities=capability or None,
                             budget=budget, base_model=base_model)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    keys = {"capability", "model_version", "val_success_before", "val_success_after"}
    emit({"adapters": [a.model_dump(mode="json", include=keys) for a in result.adapters]}, as_json, "train")


@app.command()
def route(
    top_k: int | None = typer.Option(None, "--top-k", help="Experts per token, per request in request mode "
                                     "(default: params.yaml's route section, else RouteConfig's)."),
    mode: str | None = typer.Option(None, "--mode", help="request | token (default: params.yaml's route "
                                    "section, else RouteConfig's)."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Stack the registered adapters into a token-routed MoE-LoRA, fit its router, register the composite."""
    try:
        from traceops.moe.route_config import RouteConfig

        RouteConfig.from_params(top_k=top_k, mode=mode)  # a bad flag fails here, before a flow starts
        result = _stage_flow(home, "traceops.flows.route", "route_flow", top_k=top_k, mode=mode)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    shown = {"router", "composite", "parent_versions", "routing"}
    emit(result.model_dump(mode="json", include=shown), as_json, "route")


@app.command()
def evaluate(
    full: bool = typer.Option(False, "--full", help="Every test task of each split (default: "
                              "params.yaml's evaluate.limit per capability)."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Evaluate base, adapters, generic LoRA, composite and champion on the held-out splits and replays."""
    try:
        result = _stage_flow(home, "traceops.flows.evaluate", "evaluate_flow", full=full)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    emit(result.model_dump(mode="json", include={"models", "report_path"}), as_json, "evaluate")


@app.command()
def promote(
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Apply the promotion gates to the last evaluation: alias `champion` if they pass, else `challenger`."""
    try:
        result = _stage_flow(home, "traceops.flows.promote", "promote_flow")
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    shown = {"promoted", "alias", "champion", "reasons"}
    emit(result.model_dump(mode="json", include=shown), as_json, "promote")


@app.command()
def rollback(
    name: str = typer.Argument("traceops.composite", help="Registered model whose champion moves back."),
    reason: str = typer.Option(..., "--reason", help="Why: recorded on both versions and in the lineage."),
    to: str | None = typer.Option(None, "--to", help="Version to make champion (default: alias `previous`)."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Move `champion` back to `previous` (or --to VERSION); the old one gets `rolled_back`. Who
    (TRACEOPS_USER or the login name), why and when are tagged on both versions, logged as an MLflow run."""
    from traceops.flows import runtime

    try:
        settings = runtime.prepare(home)
        from traceops.tasks.rollback import rollback_run

        result = rollback_run(settings, name, reason, to)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    emit(result.model_dump(mode="json"), as_json, "rollback")


@app.command()
def lineage(
    model_uri: str = typer.Argument("traceops.composite@champion",
                                    help="name@alias or name/version of a registered model."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Audit a registered model: every run, data version, environment version and raw file behind it."""
    from traceops.flows import runtime

    try:
        settings = runtime.prepare(home)
        from traceops.lineage import lineage as build_lineage
        from traceops.lineage import render_tree

        tree = build_lineage(settings.paths, model_uri)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    if as_json:
        emit(tree, True)
    else:
        Console().print(render_tree(tree), markup=False, highlight=False)
    if not tree.get("ok", False):
        raise typer.Exit(code=1)


@app.command()
def run(
    logs: list[Path] | None = typer.Option(None, "--logs", help="Log folders or files (default: data/raw)."),
    outcomes: Path | None = typer.Option(None, "--outcomes", help="Side file mapping task ids to outcomes."),
    calibrate: str | None = typer.Option(None, "--calibrate",
                                         help="Calibrate environments on this model (e.g. embedded)."),
    wait: float = typer.Option(0.0, "--wait", help="Seconds to wait for another run to release the home."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Run the nightly flow once, in process: ingest through promote."""
    from traceops.flows import runtime

    try:
        settings = runtime.prepare(home)
        paths = [str(p) for p in (logs or [settings.paths.raw])]
        from traceops.formats.detect import check_paths

        check_paths(paths)
        from traceops.flows.nightly import nightly_flow

        with runtime.home_lock(settings, wait_s=wait):
            result = nightly_flow(logs=paths, home=str(settings.paths.home),
                                  outcomes=str(outcomes) if outcomes else None, calibrate_model=calibrate)
    except TraceopsError as exc:
        fail(exc, as_json)
        return
    from traceops.flows.nightly import json_summary, night_summary_markdown

    if as_json:
        emit(json_summary(result), True)
        return
    from rich.markdown import Markdown

    Console().print(Markdown(night_summary_markdown(result)))
    report = (result.evaluate.report_path if result.evaluate is not None
              else result.diagnose.report if result.diagnose is not None else None)
    Console().print(f"Report: {report}\n"
                    f"MLflow UI: mlflow ui --backend-store-uri {settings.paths.mlflow_uri}\n"
                    f"Prefect UI: PREFECT_HOME={settings.paths.prefect_home} prefect server start\n"
                    "Lineage: traceops lineage traceops.composite@champion")


@app.command()
def serve(
    model: str | None = typer.Argument(
        None, help="traceops.composite@champion | traceops.adapter.<capability>/<version> | models:/... | an "
                   "adapter or composite folder | embedded | a local HF folder | http(s)://host/v1#model "
                   "(default: the home's champion composite, else embedded)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    api_key_env: str | None = typer.Option(None, "--api-key-env",
                                           help="Require the key held in this environment variable."),
    base_model: str | None = typer.Option(None, "--base-model",
                                          help="Base of an adapter or composite (default: its own record)."),
    home: Path | None = typer.Option(None, "--home", help="State home (default: TRACEOPS_HOME or cwd)."),
    reload_key_env: str | None = typer.Option(
        None, "--reload-key-env", help="Allow POST /v1/reload with the key held in this env variable."),
    poll_seconds: float | None = typer.Option(
        None, "--poll-seconds", help="Check the champion alias every N seconds; 0: off (params.yaml serve)."),
    queue_size: int | None = typer.Option(
        None, "--queue-size", help="Requests queued per model before 503 + Retry-After (params.yaml serve)."),
    no_log_traffic: bool = typer.Option(
        False, "--no-log-traffic", help="Do not append served exchanges under data/raw/served/."),
) -> None:
    """Serve the champion, its base and every registered adapter over an OpenAI-compatible
    /v1/chat/completions endpoint (the request's model picks one; tool calls included)."""
    from traceops.serve import serve as run_server

    try:
        run_server(model, host=host, port=port, api_key_env=api_key_env, base_model=base_model, home=home,
                   reload_key_env=reload_key_env, poll_seconds=poll_seconds, queue_size=queue_size,
                   log_traffic=False if no_log_traffic else None)
    except TraceopsError as exc:
        fail(exc, False)


def main() -> None:
    """Entry point for ``python -m traceops``."""
    app()
