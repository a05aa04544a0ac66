"""Atomic file and folder writes: build next to the target, then rename into place.

A reader of ``path`` sees either the old content or the new one, never a half-written file: the data
goes into a temp sibling (same folder, so the rename stays on one filesystem) named
``.<name>.<random>.tmp``, which is renamed over ``path`` only once it is complete and removed when
writing fails. Temp files and folders get the usual permissions (umask applies), not the private
ones of ``tempfile.mkstemp``/``mkdtemp``, so published files read like any other.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temp_sibling(path: str | Path, *, folder: bool = False) -> Path:
    """Create and return an empty temp file (or folder) next to ``path``; its parent is created too.

    Streaming writers that keep the file open use this directly and publish with ``os.replace``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            if folder:
                tmp.mkdir()
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return tmp


def discard(tmp: str | Path) -> None:
    """Remove a temp file or folder, whichever it is; missing is fine."""
    tmp = Path(tmp)
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp file path next to ``path``; it replaces ``path`` on success and is removed on error."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield a temp folder next to ``path``; on success it takes the place of ``path`` (an old folder
    there is moved aside, then deleted), on error it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = temp_sibling(path, folder=True)
    old: Path | None = None
    try:
        yield tmp
        if path.exists() or path.is_symlink():
            # Move the old entry aside first so that ``path`` is never a half-deleted folder
            # (a folder may be renamed over an empty folder, a file over a file).
            old = temp_sibling(path, folder=path.is_dir() and not path.is_symlink())
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        if old is not None and not path.exists():
            os.replace(old, path)  # the swap failed half-way: put the old entry back
        elif old is not None:
            discard(old)  # moving the old entry aside failed: drop the empty reserved entry
        discard(tmp)
        raise
    if old is not None:
        discard(old)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (flushed to disk before the rename); returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically in ``encoding``; returns ``path``."""
    return atomic_write_bytes(path, text.encode(encoding))
