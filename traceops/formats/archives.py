"""Zip and tar archives read as folders: each member is one input file, nothing is extracted.

A member is named ``<archive>!/<path/in/archive>`` in ``source.file`` and in rejections. Members
are checked before a byte is read: absolute paths, ``..`` components, symlinks, hardlinks, devices
and FIFOs are refused with one ``Rejected`` each; so are members whose uncompressed size is over
``max_member_bytes`` or (zip) whose compression ratio is over ``max_ratio``, and, in a tar, every
member once the bytes read pass ``max_ratio`` times the archive's size (a decompression bomb).

The readers take file paths, so a member's bytes are streamed, size-capped, into a private
temporary folder under a fresh name that keeps only the member's base name (readers look at the
suffix), read there and deleted: the member's own path never touches the file system. Zip members
are read in sorted name order, tar members in archive order (a compressed tar cannot seek back).
Hidden members (a path component starting with ".") and folders are skipped, as in a folder walk;
archives inside archives are not opened (their bytes reach the readers, which reject them).
"""

from __future__ import annotations

import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO

from traceops.formats.base import ReadItem, Rejected
from traceops.formats.files import FILE_RECORD
from traceops.schema import Trajectory

MAX_MEMBER_BYTES = 1024 * 1024 * 1024
MAX_RATIO = 100.0
# Below this many bytes read, a tar is never judged a bomb (tiny archives compress text very well).
_RATIO_FLOOR = 16 * 1024 * 1024
_CHUNK = 1 << 20
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")

ReadFile = Callable[[Path], Iterator[ReadItem]]


def is_archive(path: Path) -> bool:
    """True for a ``.zip`` or a (compressed) ``.tar`` file, judged by its name."""
    name = path.name.lower()
    return name.endswith(".zip") or name.endswith(_TAR_SUFFIXES)


def member_name(archive: Path | str, member: str) -> str:
    """How a member is named in ``source.file``: ``archive.zip!/path/in/archive.jsonl``."""
    return f"{archive}!/{member}"


def unsafe_reason(name: str) -> str | None:
    """Why a member path may not be read (absolute, drive-qualified, ``..``), or None when it is safe."""
    if not name or name.startswith(("/", "\\")):
        return "member has an absolute path"
    if len(name) > 1 and name[1] == ":":
        return "member path starts with a drive letter"
    if "\x00" in name:
        return "member path contains a NUL byte"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "member path contains '..' (path traversal)"
    return None


def _skip(name: str) -> bool:
    """Folders and hidden entries are not records."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    return not parts or any(p.startswith(".") for p in parts)


def read_archive(path: Path, read: ReadFile, *, max_member_bytes: int = MAX_MEMBER_BYTES,
                 max_ratio: float = MAX_RATIO) -> Iterator[ReadItem]:
    """Read every member of a zip or tar with ``read`` (one file's reader); see the module docstring."""
    reader = _zip_members if path.name.lower().endswith(".zip") else _tar_members
    with tempfile.TemporaryDirectory(prefix="traceops-archive-") as scratch:
        try:
            yield from reader(path, Path(scratch), read, max_member_bytes, max_ratio)
        except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError, ValueError) as error:
            yield Rejected(str(path), FILE_RECORD,
                           f"cannot read the archive ({type(error).__name__}: {error}); re-create or re-copy "
                           "it", raw="")


def _refuse(path: Path, name: str, reason: str) -> Rejected:
    return Rejected(member_name(path, name), FILE_RECORD, f"archive member refused, not read: {reason}",
                    raw="")


def _zip_members(path: Path, scratch: Path, read: ReadFile, max_bytes: int,
                 max_ratio: float) -> Iterator[ReadItem]:
    with zipfile.ZipFile(path) as archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            name = info.filename
            if info.is_dir() and unsafe_reason(name) is None:
                continue
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type recorded (plain file)
            reason = unsafe_reason(name)
            if reason is None and kind == stat.S_IFLNK:
                reason = "member is a symbolic link"
            elif reason is None and kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                reason = "member is not a regular file (device, FIFO or socket)"
            elif reason is None and info.file_size > max_bytes:
                reason = (f"member is {info.file_size} bytes uncompressed, over the {max_bytes}-byte limit "
                          "(possible zip bomb)")
            elif reason is None and info.file_size > max_ratio * max(info.compress_size, 1) \
                    and info.file_size > 1024:
                reason = (f"member expands {info.file_size / max(info.compress_size, 1):.0f}x, over the "
                          f"{max_ratio:.0f}x ratio limit (possible zip bomb)")
            if reason is not None:
                yield _refuse(path, name, reason)
                continue
            if _skip(name):
                continue
            with archive.open(info) as stream:
                yield from _read_member(path, name, stream, scratch, read, max_bytes)


def _tar_members(path: Path, scratch: Path, read: ReadFile, max_bytes: int,
                 max_ratio: float) -> Iterator[ReadItem]:
    budget = max(max_ratio * path.stat().st_size, _RATIO_FLOOR)
    total = 0
    # Streaming mode ("r|*"): members are visited once, in order, without seeking or listing first.
    with tarfile.open(path, mode="r|*") as archive:
        for member in archive:
            name = member.name
            reason = unsafe_reason(name)
            if reason is None and member.issym():
                reason = f"member is a symbolic link (to {member.linkname!r})"
            elif reason is None and member.islnk():
                reason = f"member is a hard link (to {member.linkname!r})"
            elif reason is None and member.isdir():
                continue
            elif reason is None and not member.isfile():
                reason = "member is not a regular file (device, FIFO or socket)"
            elif reason is None and member.size > max_bytes:
                reason = (f"member is {member.size} bytes, over the {max_bytes}-byte limit "
                          "(possible decompression bomb)")
            elif reason is None and total + member.size > budget:
                reason = (f"archive expands past {max_ratio:.0f}x its {path.stat().st_size}-byte size "
                          "(possible decompression bomb)")
            if reason is not None:
                yield _refuse(path, name, reason)
                continue
            if _skip(name):
                continue
            total += member.size
            stream = archive.extractfile(member)
            if stream is None:
                yield _refuse(path, name, "member has no readable content")
                continue
            with stream:
                yield from _read_member(path, name, stream, scratch, read, max_bytes)


def _read_member(archive: Path, name: str, stream: IO[bytes], scratch: Path, read: ReadFile,
                 max_bytes: int) -> Iterator[ReadItem]:
    """Spool one member (at most ``max_bytes``) under a private name, read it, rename its items."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    folder = Path(tempfile.mkdtemp(dir=scratch))
    local = folder / parts[-1]  # _skip ruled out names without a real last part
    written = 0
    try:
        with open(local, "wb") as out:
            while block := stream.read(_CHUNK):
                written += len(block)
                if written > max_bytes:
                    break
                out.write(block)
    except OSError as error:
        shutil.rmtree(folder, ignore_errors=True)
        yield _refuse(archive, name, f"member could not be spooled for reading ({error.strerror or error})")
        return
    try:
        if written > max_bytes:
            yield _refuse(archive, name, f"member expands past the {max_bytes}-byte limit (possible "
                                         "decompression bomb)")
            return
        shown = member_name(archive, name)
        for item in read(local):
            yield _rename(item, str(local), shown)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rename(item: ReadItem, local: str, shown: str) -> ReadItem:
    """Replace the spool file's path by the member's name (``source`` is not part of the id)."""
    if isinstance(item, Trajectory):
        if item.source.file == local:
            item.source.file = shown
        return item
    if item.file == local:
        return replace(item, file=shown, reason=item.reason.replace(local, shown))
    return item
