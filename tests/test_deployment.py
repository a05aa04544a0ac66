"""prefect.yaml: the nightly deployment points at a real flow, on a valid cron schedule."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_prefect_yaml_deploys_the_scheduled_nightly_flow() -> None:
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.flows import load_flow_from_entrypoint

    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (deployment,) = [d for d in doc["deployments"] if d["name"] == "traceops-nightly"]
    flow = load_flow_from_entrypoint(str(ROOT / deployment["entrypoint"]))
    assert flow.name == "traceops-nightly-scheduled"
    # Every parameter the deployment sets is one the flow accepts.
    assert set(deployment["parameters"]) <= set(flow.parameters.properties)
    (schedule,) = deployment["schedules"]
    CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])  # raises when invalid
    assert deployment["concurrency_limit"] == 1
