"""Which domain a served exchange belongs to, so tomorrow's ingest files it where it came from.

The first that applies: the request's own statement (``metadata.domain`` in the body, or the
``X-Traceops-Domain`` header: ``traceops.traffic``), then ``serve.domain`` in params.yaml, then the
domain the served registry version was trained on when there is exactly one (``trained_domains``),
else none (the record ingests as ``unknown``).

The registry records no domain tag; a version's domain is found through its lineage: an adapter's
``traceops.env_version`` names the synthesize run that wrote its environments, whose
``manifests/<capability>.json`` artifact holds the grounding's domain; a composite's domains are its
adapter parents' (``traceops.parent_versions``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from traceops import registry
from traceops.config import Paths
from traceops.registry import ModelRef
from traceops.tags import TAG_CAPABILITY, TAG_ENV_VERSION, TAG_PARENT_VERSIONS

# Where the synthesize task logs each capability's environment manifest (tasks/synthesize.py).
MANIFEST_ARTIFACT = "manifests/{capability}.json"
UNKNOWN = "unknown"


def _synthesize_run(client: Any, env_version: str) -> str | None:
    """The latest synthesize run that wrote environments version ``env_version``."""
    experiment = client.get_experiment_by_name(registry.experiment_name("synthesize"))
    if experiment is None or not env_version:
        return None
    runs = client.search_runs([experiment.experiment_id],
                              f"tags.`{TAG_ENV_VERSION}` = '{env_version}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def _adapter_domains(client: Any, tags: dict[str, str]) -> set[str]:
    capability = tags.get(TAG_CAPABILITY)
    run_id = _synthesize_run(client, tags.get(TAG_ENV_VERSION, ""))
    if not capability or run_id is None:
        return set()
    try:
        with tempfile.TemporaryDirectory() as folder:
            local = client.download_artifacts(run_id, MANIFEST_ARTIFACT.format(capability=capability), folder)
            manifest = json.loads(Path(local).read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - no manifest logged (an older run): the domain is unknown
        return set()
    domain = (manifest.get("grounding") or {}).get("domain")
    return {domain} if isinstance(domain, str) and domain and domain != UNKNOWN else set()


def trained_domains(ref: ModelRef, paths: Paths) -> set[str]:
    """The domains the registered version ``ref`` (in the home of ``paths``) was trained on (module
    docstring); empty when its lineage does not say."""
    from mlflow import MlflowClient

    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    tags = dict(client.get_model_version(ref.name, ref.version).tags or {})
    if TAG_PARENT_VERSIONS not in tags:
        return _adapter_domains(client, tags)
    domains: set[str] = set()
    for name, version in json.loads(tags[TAG_PARENT_VERSIONS]).items():
        if name.startswith(registry.ADAPTER_PREFIX):
            domains |= _adapter_domains(client, dict(client.get_model_version(name, str(version)).tags or {}))
    return domains


def served_domain(ref: ModelRef | None, paths: Paths | None, configured: str | None) -> str | None:
    """The domain a served model's exchanges are logged under when the request names none:
    ``configured`` (``serve.domain``), else the registered version's one training domain, else None."""
    if configured:
        return configured
    if ref is None or paths is None:
        return None
    try:
        domains = trained_domains(ref, paths)
    except Exception as exc:  # noqa: BLE001 - a registry hiccup must not stop the model from serving
        sys.stderr.write(f"traceops serve: could not read the training domain of {ref.uri}: {exc}; its "
                         "exchanges are logged without one (set serve.domain in params.yaml)\n")
        return None
    return next(iter(domains)) if len(domains) == 1 else None
