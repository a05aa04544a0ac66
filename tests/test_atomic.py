"""Atomic writes: content lands whole or not at all, temp siblings never linger."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from traceops.atomic import (
    atomic_folder,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    discard,
    temp_sibling,
)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_text_and_bytes_create_parents_and_replace(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.json"
    assert atomic_write_text(target, "é first\n") == target
    assert target.read_text(encoding="utf-8") == "é first\n"
    atomic_write_bytes(target, b"\x00second")
    assert target.read_bytes() == b"\x00second"
    assert _leftovers(target.parent) == []


def test_written_file_follows_the_umask_not_mkstemp(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        target = atomic_write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o644


def test_atomic_path_failure_keeps_old_content_and_removes_temp(tmp_path: Path) -> None:
    target = tmp_path / "data.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".data.txt.") and tmp.exists()
        tmp.write_text("half")
        raise RuntimeError("writer crashed")
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_temp_siblings_are_unique_and_discard_handles_both_kinds(tmp_path: Path) -> None:
    target = tmp_path / "x"
    files = {temp_sibling(target) for _ in range(20)}
    assert len(files) == 20 and all(f.is_file() for f in files)
    folder = temp_sibling(target, folder=True)
    (folder / "inner").write_text("1")
    for entry in [*files, folder]:
        discard(entry)
    discard(tmp_path / "never-existed")
    assert list(tmp_path.iterdir()) == []


def test_atomic_folder_replaces_an_existing_folder(tmp_path: Path) -> None:
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "stale.bin").write_text("stale")
    with atomic_folder(target) as tmp:
        assert not (tmp / "stale.bin").exists()
        (tmp / "weights.bin").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["weights.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_atomic_folder_failure_leaves_the_old_folder(tmp_path: Path) -> None:
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "good.bin").write_text("good")
    with pytest.raises(ValueError), atomic_folder(target) as tmp:
        (tmp / "partial.bin").write_text("half")
        raise ValueError("save failed")
    assert [p.name for p in target.iterdir()] == ["good.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_atomic_folder_replaces_a_file_at_the_target(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.write_text("a file")
    with atomic_folder(target) as tmp:
        (tmp / "x").write_text("1")
    assert target.is_dir() and (target / "x").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
