"""Write a Diagnosis to its folder: capabilities.json, attributions.parquet, report.html."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from traceops.diagnose.attribution import attributions_frame
from traceops.diagnose.report import render_report
from traceops.diagnose.run import Diagnosis


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_outputs(diagnosis: Diagnosis, out_dir: str | Path) -> dict[str, Path]:
    """Write the three diagnosis files (atomically) and return their paths by name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "capabilities": out / "capabilities.json",
        "attributions": out / "attributions.parquet",
        "report": out / "report.html",
    }
    body = json.dumps(diagnosis.capabilities_json(), indent=1, sort_keys=False, default=str, allow_nan=False)
    _atomic_write(paths["capabilities"], body.encode("utf-8"))
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".attributions.", suffix=".parquet")
    os.close(fd)
    try:
        attributions_frame(diagnosis.attributions).to_parquet(tmp, index=False)
        os.replace(tmp, paths["attributions"])
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _atomic_write(paths["report"], render_report(diagnosis).encode("utf-8"))
    return paths
