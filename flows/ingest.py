"""The ingest flow: `traceops ingest` and the nightly flow's first stage."""

from __future__ import annotations

from prefect import flow

from traceops.results import IngestResult
from traceops.tasks.ingest import ingest_task


@flow(name="traceops-ingest", log_prints=False)
def ingest_flow(paths: list[str], fmt: str = "auto", outcomes: str | None = None,
                home: str | None = None) -> IngestResult:
    """Ingest log files or folders into the home's curated store and version it."""
    return ingest_task(paths, fmt=fmt, outcomes=outcomes, home=home)
