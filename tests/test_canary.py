"""Secrets never land in anything a night writes: a real nightly run whose calibration talks to a real
key-protected model server, with canary values in the API-key variables, then every byte under the home
(MLflow store and artifacts, data/, DVC cache and remote, Prefect database, every git object) and every
line the night printed is searched for the canaries."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_faults import fast_params, make_home, start_night
from test_serve import running

from traceops.model.base import GenerationConfig, ModelInfo
from traceops.serve import create_app

pytestmark = pytest.mark.slow

# Unique per run, so no earlier file can match by accident; the same prefix style as real keys.
CANARY = f"sk-canary-{uuid.uuid4().hex}"
# Other credentials a process environment commonly holds: none of them may be dumped either.
OTHER_SECRETS = {"HF_TOKEN": f"hf_canary{uuid.uuid4().hex}",
                 "AWS_SECRET_ACCESS_KEY": f"aws-canary-{uuid.uuid4().hex}"}


class Refuser:
    """Stands in for a remote LLM behind the real server: answers every episode at once, with no call."""

    info = ModelInfo(model_id="refuser", weights_hash="0" * 64)

    def __init__(self) -> None:
        self.conversations = 0

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[str]:
        self.conversations += len(conversations)
        return ["Sorry, I cannot help with that."] * len(conversations)


def git_objects(home: Path) -> bytes:
    """Every object in the home's git repository, decompressed (commits, trees, blobs of every version)."""
    return subprocess.run(["git", "-C", str(home), "cat-file", "--batch-all-objects", "--batch"],
                          capture_output=True, check=True).stdout


def parquet_text(path: Path) -> bytes:
    """A Parquet file's values as text (its pages may be compressed, so raw bytes could hide a value)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pandas().to_csv().encode()


def places_holding(secret: str, home: Path, outputs: dict[str, bytes]) -> list[str]:
    """Every file under ``home``, git object store and process output that contains ``secret``."""
    needle = secret.encode()
    found = [name for name, text in outputs.items() if needle in text]
    files = [p for p in home.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(files) > 50  # the scan really covers a night's worth of state
    found += [str(p.relative_to(home)) for p in files if needle in p.read_bytes()]
    found += [str(p.relative_to(home)) + " (decoded)" for p in files
              if p.suffix == ".parquet" and needle in parquet_text(p)]
    if needle in git_objects(home):
        found.append("git objects")
    return found


def test_api_keys_never_reach_the_home_or_the_output(tmp_path: Path, tiny_model_dir: Path) -> None:
    home = make_home(tmp_path / "home", tiny_model_dir)
    # One calibration episode per level keeps the work small.
    fast = fast_params(tiny_model_dir)
    params = {**fast, "synthesize": {**fast["synthesize"], "calibration_per_level": 1}}
    (home / "params.yaml").write_text(json.dumps(params))
    model = Refuser()
    with running(create_app(model, api_key=CANARY)) as url:
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401  # the key is required
        code, result, output = start_night(
            home, "--calibrate", f"{url}/v1#refuser",
            extra_env={"OPENAI_API_KEY": CANARY, **OTHER_SECRETS}).finish()
    assert code == 0, output[-3000:]
    assert result["env_version"]
    # The key was really sent: calibration went through the key-protected server for every family.
    manifests = list((home / "data" / "environments").glob("*/manifest.json"))
    assert manifests and all(json.loads(m.read_text())["calibration"]["status"] == "measured"
                             for m in manifests)
    assert model.conversations >= len(manifests)

    for secret in (CANARY, *OTHER_SECRETS.values()):
        assert places_holding(secret, home, {"night output": output.encode()}) == []
