"""DVC versioning of data folders (data/curated, data/environments/<capability>).

The home is a DVC repository with a local default remote (``settings.paths.dvc_remote``, inside the
home). ``commit_data`` runs ``dvc add`` on a folder, pushes it to that remote, commits the ``.dvc``
file (and the ``.gitignore`` DVC writes next to the data) to git when git is usable, and returns the
folder's data version: the md5 DVC records in the ``.dvc`` file. Unchanged data gives the same version
and no new git commit.

DVC is driven through its Python API (``dvc.repo.Repo``); git through the ``git`` executable.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from traceops.config import Paths
from traceops.errors import StageError

_REMOTE_NAME = "local"
_GIT_USER = ("traceops", "traceops@localhost")


def _git(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git in ``home``; raise StageError with git's message on failure when ``check``."""
    proc = subprocess.run(["git", *args], cwd=home, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise StageError(f"versioning: `git {' '.join(args)}` failed in {home}: "
                         f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _git_usable() -> bool:
    return shutil.which("git") is not None


def _git_root(home: Path) -> Path | None:
    """The top of the git work tree containing ``home``, or None when it is not in one."""
    if not _git_usable():
        return None
    proc = _git(home, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        return None
    return Path(proc.stdout.strip()).resolve()


def _ensure_git_identity(home: Path) -> None:
    """Give the repository a local author when none is configured, so commits cannot fail on it."""
    for key, value in zip(("user.name", "user.email"), _GIT_USER, strict=True):
        if _git(home, "config", key, check=False).stdout.strip() == "":
            _git(home, "config", "--local", key, value)


def ensure_repo(home: str | Path) -> None:
    """Make ``home`` a DVC repository with its local remote as default; idempotent.

    A home outside any git work tree gets its own git repository (with a local author when none is
    configured). A home inside a git work tree (the project checkout, say) gets DVC initialized in
    it, as a subdirectory repository when it is not the work tree's top.
    """
    from dvc.repo import Repo

    root = Path(home).resolve()
    root.mkdir(parents=True, exist_ok=True)
    git_root = _git_root(root)
    if git_root is None and _git_usable():
        _git(root, "init", "--quiet")
        git_root = root
    if git_root is not None:
        _ensure_git_identity(root)
    if not (root / ".dvc").is_dir():
        dvc_logger = logging.getLogger("dvc")
        level = dvc_logger.level
        dvc_logger.setLevel(logging.WARNING)  # DVC's "Initialized DVC repository" banner
        try:
            Repo.init(str(root), no_scm=git_root is None, subdir=git_root is not None and git_root != root)
        finally:
            dvc_logger.setLevel(level)
    remote = Paths(root).dvc_remote
    remote.mkdir(parents=True, exist_ok=True)
    with Repo(str(root)) as repo, repo.config.edit() as conf:
        conf["core"]["remote"] = _REMOTE_NAME
        conf["core"]["analytics"] = False
        conf["core"]["autostage"] = False
        conf["core"]["site_cache_dir"] = str(root / ".dvc" / "tmp" / "site")
        conf["remote"][_REMOTE_NAME] = {"url": str(remote)}
    # The remote lives inside the home: keep it out of git (via the repository's local exclude file,
    # so no tracked .gitignore of the user's is edited) and out of DVC's own view.
    if git_root is not None:
        exclude = Path(_git(root, "rev-parse", "--git-path", "info/exclude").stdout.strip())
        exclude = exclude if exclude.is_absolute() else root / exclude
        exclude.parent.mkdir(parents=True, exist_ok=True)
        _append_line(exclude, f"/{remote.relative_to(git_root).as_posix()}/")
    _append_line(root / ".dvcignore", f"/{remote.relative_to(root).as_posix()}/")


def _append_line(path: Path, line: str) -> None:
    """Add ``line`` to a text file unless it is already there."""
    existing = path.read_text().splitlines() if path.exists() else []
    if line not in existing:
        with open(path, "a", encoding="utf-8") as handle:
            if existing and not path.read_text().endswith("\n"):
                handle.write("\n")
            handle.write(line + "\n")


def _dvc_file(root: Path, rel_path: str | Path) -> Path:
    target = root / rel_path
    return target.parent / f"{target.name}.dvc"


def data_version(home: str | Path, rel_path: str | Path) -> str | None:
    """The md5 DVC recorded for ``rel_path`` (relative to the home), or None when it is not tracked."""
    dvc_file = _dvc_file(Path(home).resolve(), rel_path)
    if not dvc_file.exists():
        return None
    doc = yaml.safe_load(dvc_file.read_text()) or {}
    outs = doc.get("outs") or []
    if not outs or "md5" not in outs[0]:
        raise StageError(f"versioning: {dvc_file} has no md5 for its output; delete it and run "
                         "`dvc add` again")
    return str(outs[0]["md5"])


def commit_data(home: str | Path, rel_path: str | Path, message: str | None = None) -> str:
    """Version the folder ``rel_path`` of ``home`` with DVC and return its data version (md5).

    Steps: ``dvc add`` (a no-op when the folder is unchanged), push to the local remote, and commit
    the ``.dvc`` file and DVC's ``.gitignore`` to git when the home is in a git work tree and they
    changed. Only those two paths are committed, whatever else is staged.
    """
    from dvc.repo import Repo

    root = Path(home).resolve()
    target = root / rel_path
    if not target.exists():
        raise StageError(f"versioning: {target} does not exist; run the stage that writes it first")
    ensure_repo(root)
    rel = target.relative_to(root).as_posix()
    previous = data_version(root, rel)
    with Repo(str(root)) as repo:
        repo.scm_context.quiet = True  # we commit the .dvc file ourselves; skip DVC's reminder
        repo.add([str(target)])
        repo.push(targets=[str(target)], remote=_REMOTE_NAME)
    version = data_version(root, rel)
    if version is None:
        raise StageError(f"versioning: dvc add of {target} wrote no {rel}.dvc file")
    git_root = _git_root(root)
    if git_root is not None:
        dvc_file = _dvc_file(root, rel)
        # Only DVC's own files: whatever else the user has staged or changed stays as it is.
        paths = [p for p in (dvc_file, dvc_file.parent / ".gitignore", root / ".dvcignore",
                             root / ".dvc" / "config", root / ".dvc" / ".gitignore") if p.exists()]
        rels = [os.path.relpath(p, root) for p in paths]
        _git(root, "add", "--", *rels)
        staged = _git(root, "diff", "--cached", "--quiet", "--", *rels, check=False)
        if staged.returncode != 0:
            text = message or (f"data: {rel} {version}" if version != previous else f"data: track {rel}")
            _git(root, "commit", "--quiet", "--no-verify", "-m", text, "--", *rels)
    return version
