"""Two runs on one home: the second refuses the home's lock with a clear message (no state touched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

pytestmark = pytest.mark.slow


def test_second_run_refuses_while_the_home_is_locked(home: Path) -> None:
    (home / "data" / "raw").mkdir(parents=True)
    lock = FileLock(str(home / ".traceops.lock"))
    env = {**os.environ, "TRACEOPS_HOME": str(home)}
    with lock:
        out = subprocess.run([sys.executable, "-m", "traceops", "run", "--json"], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 2, out.stderr
    error = json.loads(out.stdout.strip().splitlines()[-1])["error"]
    assert "another traceops run holds" in error and "--wait" in error
    assert not (home / "data" / "curated").exists()
