"""Zip and tar archives are read as folders; unsafe members are refused, never written anywhere."""

from __future__ import annotations

import io
import json
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceops import config
from traceops.formats import Rejected, iter_items
from traceops.formats.archives import read_archive, unsafe_reason
from traceops.formats.detect import read_file
from traceops.ingest import ingest_paths
from traceops.schema import Trajectory
from traceops.store import load_trajectories


def record(i: int) -> str:
    return json.dumps({"task_id": f"t{i}", "messages": [{"role": "user", "content": f"hello {i}"},
                                                         {"role": "assistant", "content": "hi"}]})


def jsonl(*ids: int) -> bytes:
    return ("\n".join(record(i) for i in ids) + "\n").encode()


def add_tar(archive: tarfile.TarFile, name: str, data: bytes = b"", **fields: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    archive.addfile(info, io.BytesIO(data) if data else None)


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


def test_zip_members_read_like_a_folder(tmp_path: Path) -> None:
    path = tmp_path / "drop.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("logs/b.jsonl", jsonl(2, 3))
        archive.writestr("logs/a.jsonl", jsonl(1))
        archive.writestr("logs/", b"")
        archive.writestr(".hidden/x.jsonl", jsonl(9))
        archive.writestr("notes.txt", b"not a log")
    items = list(iter_items([tmp_path]))
    trajectories = [i for i in items if isinstance(i, Trajectory)]
    assert [t.task_id for t in trajectories] == ["t1", "t2", "t3"]  # sorted member order
    assert [t.source.file for t in trajectories] == [f"{path}!/logs/a.jsonl"] + [f"{path}!/logs/b.jsonl"] * 2
    assert [t.source.record for t in trajectories] == [1, 1, 2]
    (rejected,) = [i for i in items if isinstance(i, Rejected)]
    assert rejected.file == f"{path}!/notes.txt" and "no reader recognizes" in rejected.reason
    # Same ids as the loose files: the archive changes where a record came from, not what it is.
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "a.jsonl").write_bytes(jsonl(1))
    (loose / "b.jsonl").write_bytes(jsonl(2, 3))
    assert [t.id for t in iter_items([loose])] == [t.id for t in trajectories]


@pytest.mark.parametrize("suffix,mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tgz", "w:gz"),
                                         (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz")])
def test_tar_members_are_read_in_archive_order(tmp_path: Path, suffix: str, mode: str) -> None:
    path = tmp_path / f"drop{suffix}"
    with tarfile.open(path, mode) as archive:
        add_tar(archive, "day", type=tarfile.DIRTYPE)
        add_tar(archive, "day/2.jsonl", jsonl(2))
        add_tar(archive, "day/1.jsonl", jsonl(1))
    items = list(iter_items([path], fmt="openai"))
    assert [(i.task_id, i.source.file) for i in items] == [("t2", f"{path}!/day/2.jsonl"),
                                                          ("t1", f"{path}!/day/1.jsonl")]


def test_unsafe_tar_members_are_refused_and_never_written(tmp_path: Path) -> None:
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        add_tar(archive, "/etc/evil.jsonl", jsonl(1))
        add_tar(archive, "../escape.jsonl", jsonl(2))
        add_tar(archive, "a/../../escape2.jsonl", jsonl(3))
        add_tar(archive, "link.jsonl", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add_tar(archive, "hard.jsonl", type=tarfile.LNKTYPE, linkname="good.jsonl")
        add_tar(archive, "dev.jsonl", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        add_tar(archive, "fifo.jsonl", type=tarfile.FIFOTYPE)
        add_tar(archive, "good.jsonl", jsonl(4))
    before = files_under(tmp_path)
    items = list(iter_items([path]))
    assert files_under(tmp_path) == before and not (tmp_path.parent / "escape.jsonl").exists()
    good = [i for i in items if isinstance(i, Trajectory)]
    assert [t.task_id for t in good] == ["t4"]
    refused = {Path(i.file.split("!/", 1)[1]).as_posix(): i.reason for i in items if isinstance(i, Rejected)}
    assert len(refused) == 7 and all("refused" in reason for reason in refused.values())
    assert "absolute" in refused["/etc/evil.jsonl"]
    assert "traversal" in refused["../escape.jsonl"] and "traversal" in refused["a/../../escape2.jsonl"]
    assert "symbolic link" in refused["link.jsonl"] and "hard link" in refused["hard.jsonl"]
    assert "not a regular file" in refused["dev.jsonl"] and "not a regular file" in refused["fifo.jsonl"]


def test_unsafe_zip_members_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("../up.jsonl", jsonl(1))
        archive.writestr("/abs.jsonl", jsonl(2))
        archive.writestr("C:/windows.jsonl", jsonl(3))
        link = zipfile.ZipInfo("link.jsonl")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
        archive.writestr("ok.jsonl", jsonl(4))
    items = list(iter_items([path]))
    assert [i.task_id for i in items if isinstance(i, Trajectory)] == ["t4"]
    reasons = sorted(i.reason for i in items if isinstance(i, Rejected))
    assert len(reasons) == 4 and all("refused" in r for r in reasons)
    assert any("symbolic link" in r for r in reasons) and any("drive letter" in r for r in reasons)


def test_zip_bomb_members_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros.jsonl", b"\n" * 2_000_000)  # deflates about 1000x
        archive.writestr("ok.jsonl", jsonl(1))
    items = list(read_archive(path, read_file))
    assert isinstance(items[1], Rejected) and "ratio limit" in items[1].reason
    assert items[1].file == f"{path}!/zeros.jsonl"
    assert isinstance(items[0], Trajectory)
    # A size limit applies whatever the ratio, and is enforced on the bytes actually read.
    small = list(read_archive(path, read_file, max_member_bytes=100, max_ratio=1e9))
    assert all(isinstance(i, Rejected) and "limit" in i.reason for i in small)


def test_tar_bomb_is_bounded_by_the_bytes_read(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        add_tar(archive, "ok.jsonl", jsonl(1))
        add_tar(archive, "big.jsonl", b"\n" * 3_000_000)
    items = list(read_archive(path, read_file, max_member_bytes=2_000_000))
    assert isinstance(items[0], Trajectory)
    assert isinstance(items[1], Rejected) and "limit" in items[1].reason


def test_corrupt_archive_is_one_rejection(tmp_path: Path) -> None:
    path = tmp_path / "broken.zip"
    path.write_bytes(b"PK\x03\x04 this is not really a zip")
    (item,) = list(iter_items([path]))
    assert isinstance(item, Rejected) and "cannot read the archive" in item.reason


def test_ingest_reads_archives_end_to_end(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "nightly.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        add_tar(archive, "logs/a.jsonl", jsonl(1, 2))
        add_tar(archive, "../evil.jsonl", jsonl(3))
    result = ingest_paths([path], config.load(home), run_id="arch", workers=1)
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    stored = list(load_trajectories(config.load(home).paths))
    assert {t.source.file for t in stored} == {f"{path}!/logs/a.jsonl"}


_SEGMENT = st.sampled_from(["..", ".", "", "a", "b.jsonl", "C:", "x\\..", "..\\y", " ", "logs"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.builds(lambda parts, lead: lead + "/".join(parts),
                                st.lists(_SEGMENT, min_size=1, max_size=4),
                                st.sampled_from(["", "/", "\\"])).filter(bool),  # zipfile cannot write ""
                      min_size=1, max_size=5, unique=True))
def test_hypothesis_member_names_never_escape(tmp_path_factory: pytest.TempPathFactory,
                                              names: list[str]) -> None:
    folder = tmp_path_factory.mktemp("arch")
    path = folder / "gen.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for k, name in enumerate(names):
            archive.writestr(zipfile.ZipInfo(name), jsonl(k))
    stored = {info.filename for info in zipfile.ZipFile(path).infolist()}  # zipfile may rewrite "\\"
    before = files_under(folder)
    items = list(iter_items([path]))
    assert files_under(folder) == before
    for item in items:
        file = item.source.file if isinstance(item, Trajectory) else item.file
        assert file.startswith(f"{path}!/")
        member = file.split("!/", 1)[1]
        assert member in stored
        parts = member.replace("\\", "/").split("/")
        unsafe = member.startswith(("/", "\\")) or ".." in parts or (len(member) > 1 and member[1] == ":")
        if unsafe:
            assert isinstance(item, Rejected) and "refused" in item.reason
        assert unsafe_reason(member) is None or unsafe
    refused = {item.file.split("!/", 1)[1] for item in items if isinstance(item, Rejected)}
    for name in stored:
        if unsafe_reason(name) is not None:
            assert name in refused
