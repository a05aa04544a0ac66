"""Read input files in worker processes, one file (or archive) per task, results in input order.

Workers run the same ``read_file`` as the serial path and ship each file as one ``FileBatch``: its
trajectories already built into Arrow tables (``store.Batch``: pickled as a few buffers, and the main
process does not rebuild columns) plus the file's item order with its rejections. Files are taken
in ``iter_files`` order and results consumed in that order, so the items, and
therefore counts, dedupe and quarantine, are identical to a serial read. At most ``2 * workers``
files are in flight, which bounds memory to a few files' results.

Start-up is kept off the critical path: this process reads the first file itself while the pool
starts (the forkserver importing the readers takes most of a second), and workers skip pyarrow's
probe for pandas (another half second each; readers never hand pyarrow a pandas object).
"""

from __future__ import annotations

import importlib.abc
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from traceops.errors import ConfigError
from traceops.formats.base import OutcomeTable, Rejected
from traceops.formats.detect import check_format, iter_files, read_file
from traceops.schema import Trajectory
from traceops.store import Batch, FlatTrajectory, TableBuilder, flatten

FlatItem = FlatTrajectory | Rejected


class FileBatch(NamedTuple):
    """Every item of one file: ``order`` lists them as read, a ``Rejected`` or None for the next
    trajectory of ``batch`` (whose ids are ``ids``, in batch order). ``last`` is set on the final
    file of an ``iter_flat`` stream: nothing follows it."""

    order: list[Rejected | None]
    ids: list[str]
    batch: Batch
    last: bool = False

_WORKER: dict[str, Any] = {}
_STATS = {"worker_cpu_s": 0.0}


def default_workers() -> int:
    """min(2, the CPUs this process may run on)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def read_flat(path: Path, fmt: str = "auto", outcomes: OutcomeTable | None = None) -> list[FlatItem]:
    """Every item of one file, trajectories flattened for the store."""
    items = read_file(path, fmt, outcomes)
    return [flatten(item) if isinstance(item, Trajectory) else item for item in items]


def read_file_batch(path: Path, fmt: str = "auto", outcomes: OutcomeTable | None = None) -> FileBatch:
    """Every item of one file, its trajectories built into one Arrow batch."""
    builder = TableBuilder()
    order: list[Rejected | None] = []
    ids: list[str] = []
    for item in read_file(path, fmt, outcomes):
        if isinstance(item, Trajectory):
            builder.add(item)
            order.append(None)
            ids.append(item.id)
        else:
            order.append(item)
    return FileBatch(order, ids, builder.build(arrow_calls=True))


class _NoPandas(importlib.abc.MetaPathFinder):
    """Makes ``import pandas`` fail while installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is not loaded in traceops reader workers")
        return None


def _skip_pandas_probe() -> None:
    """Let pyarrow's one-time pandas probe fail fast in this process.

    pyarrow imports pandas (0.5-0.8 s) on its first conversion only to ask whether the input is a
    pandas object; readers hand it lists, so a worker records "no pandas" instead. Only for
    reader workers: explicit pandas conversions would still import it on demand.
    """
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


def _init_worker(fmt: str, outcomes: OutcomeTable | None) -> None:
    _skip_pandas_probe()
    _WORKER["fmt"] = fmt
    _WORKER["outcomes"] = outcomes


def _read_in_worker(path: str) -> tuple[FileBatch, float]:
    start = time.process_time()
    items = read_file_batch(Path(path), _WORKER["fmt"], _WORKER["outcomes"])
    return items, time.process_time() - start


def worker_cpu_seconds() -> float:
    """CPU seconds worker processes have spent reading, summed over every pooled read so far.

    Workers are children of the forkserver, not of this process, so ``RUSAGE_CHILDREN`` misses
    them; benchmarks add this instead.
    """
    return _STATS["worker_cpu_s"]


def iter_flat(paths: Sequence[str | Path], fmt: str = "auto", outcomes: OutcomeTable | None = None,
              workers: int = 1) -> Iterator[FileBatch]:
    """One ``FileBatch`` per file in ``iter_items`` order, read by ``workers`` processes (1: in this process).

    The format, the worker count and the paths are checked when this is called, before any read.
    """
    check_format(fmt)
    if workers < 1:
        raise ConfigError(f"ingest: workers must be >= 1, got {workers} (params.yaml ingest.workers)")
    files = list(iter_files([paths] if isinstance(paths, (str, Path)) else paths))
    if workers == 1 or len(files) < 2:
        batches: Iterator[FileBatch] = (read_file_batch(path, fmt, outcomes) for path in files)
    else:
        batches = _pooled(files, fmt, outcomes, min(workers, len(files)))
    return _mark_last(batches, len(files))


def _mark_last(batches: Iterator[FileBatch], count: int) -> Iterator[FileBatch]:
    for index, batch in enumerate(batches):
        yield batch._replace(last=True) if index == count - 1 else batch


def _pooled(files: list[Path], fmt: str, outcomes: OutcomeTable | None, workers: int) -> Iterator[FileBatch]:
    # forkserver: workers fork from a clean server process, not from a parent that may hold threads.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["traceops.formats.parallel"])
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                               initargs=(fmt, outcomes))
    queue = iter(files[1:])
    pending: deque[Future[tuple[FileBatch, float]]] = deque()
    failed: list[BaseException] = []

    def start() -> None:
        # submit() blocks until the forkserver has imported the readers and forked a worker.
        try:
            for path in queue:
                pending.append(pool.submit(_read_in_worker, str(path)))
                if len(pending) >= 2 * workers:
                    break
        except BaseException as error:  # re-raised in the consuming thread below
            failed.append(error)

    starter = threading.Thread(target=start, name="traceops-pool-start", daemon=True)
    starter.start()
    try:
        yield read_file_batch(files[0], fmt, outcomes)  # read here while the pool starts
        starter.join()
        if failed:
            raise failed[0]
        while pending:
            items, cpu = pending.popleft().result()
            _STATS["worker_cpu_s"] += cpu
            following = next(queue, None)
            if following is not None:
                pending.append(pool.submit(_read_in_worker, str(following)))
            yield items
    finally:
        starter.join()
        pool.shutdown(wait=True, cancel_futures=True)
