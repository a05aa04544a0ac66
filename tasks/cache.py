"""Content-hash caching for stage tasks.

A stage task takes a ``key`` parameter that the flow computes from the content hashes of everything the
stage reads (data version, parameters, upstream versions). Prefect persists the task's JSON result under
that key, so a rerun with unchanged inputs returns at once. Because a stage's real outputs live outside
Prefect (files, DVC, MLflow), the flow checks them after a cache hit and reruns the task with
``refresh_cache=True`` when they are gone.

Every key also holds the version of the code that computes the stages (a hash of traceops' sources):
an upgraded generator, labeler or trainer must not be answered by results of the old code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

import traceops
from traceops.config import resolve_home
from traceops.hashing import content_hash, folder_hash


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Hex sha256 over the relative paths and contents of the traceops package's Python sources."""
    return folder_hash(Path(traceops.__file__).resolve().parent, "*.py")


def stage_key(stage: str, *inputs: Any) -> str:
    """Cache key of one stage run: the stage name plus a hash of the code version and its inputs."""
    return f"{stage}-{content_hash([code_version(), *inputs], length=24)}"


def key_from_parameter(context: Any, parameters: dict[str, Any]) -> str:
    """Prefect ``cache_key_fn``: the ``key`` parameter computed by the flow, scoped to the task's home.

    A cached result names files and MLflow runs of one home, so it must never answer for another: Prefect
    fixes its result storage when it is imported, and one process (a test session, a library user) may
    run flows over several homes with the same content hashes.
    """
    home = resolve_home(parameters.get("home"))
    return f"{parameters['key']}-{content_hash(str(home), length=12)}"


ResultT = TypeVar("ResultT", bound=BaseModel)

CACHED = {"cache_key_fn": key_from_parameter, "persist_result": True, "result_serializer": "json"}


def run_cached(task: Any, outputs_ok: Callable[[ResultT], bool], **kwargs: Any) -> ResultT:
    """Run a cached stage task; when a cached result's outputs no longer exist, run it again for real."""
    result = task(**kwargs)
    if outputs_ok(result):
        return result
    return task.with_options(refresh_cache=True)(**kwargs)
