"""DVC versioning in a real git + DVC repository inside the temporary home."""

from __future__ import annotations

import subprocess
from pathlib import Path

from traceops import config, versioning


def git(home: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=home, capture_output=True, text=True, check=True).stdout


def commits(home: Path) -> int:
    return int(git(home, "rev-list", "--count", "HEAD").strip())


def test_ensure_repo_is_idempotent(home: Path) -> None:
    versioning.ensure_repo(home)
    versioning.ensure_repo(home)
    assert (home / ".git").is_dir() and (home / ".dvc" / "config").is_file()
    conf = (home / ".dvc" / "config").read_text()
    assert "remote = local" in conf and str(config.load(home).paths.dvc_remote) in conf
    assert (home / ".git" / "info" / "exclude").read_text().count("/.dvc-remote/") == 1
    assert git(home, "status", "--porcelain", "--untracked-files=all", "--", ".dvc-remote") == ""
    assert git(home, "config", "user.email").strip()


def test_commit_data_versions_and_is_idempotent(home: Path) -> None:
    curated = home / "data" / "curated"
    curated.mkdir(parents=True)
    (curated / "a.txt").write_text("one\n")
    assert versioning.data_version(home, "data/curated") is None

    first = versioning.commit_data(home, "data/curated")
    assert first.endswith(".dir") and versioning.data_version(home, "data/curated") == first
    assert "/curated" in (home / "data" / ".gitignore").read_text()
    n_commits = commits(home)
    assert "data/curated.dvc" in git(home, "ls-files")
    # pushed: the remote holds the objects
    assert any(p.is_file() for p in config.load(home).paths.dvc_remote.rglob("*"))
    assert git(home, "status", "--porcelain", "--untracked-files=all", "--", ".dvc-remote") == ""

    assert versioning.commit_data(home, "data/curated") == first
    assert commits(home) == n_commits  # unchanged data: no new commit

    (curated / "b.txt").write_text("two\n")
    second = versioning.commit_data(home, "data/curated")
    assert second != first and commits(home) == n_commits + 1
    assert git(home, "status", "--porcelain", "--", "data").strip() == ""


def test_home_inside_existing_git_repo(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "--quiet"], cwd=project, check=True)
    (project / "README.md").write_text("mine\n")
    # staged by the user: commit_data must leave it staged, not commit it
    subprocess.run(["git", "add", "README.md"], cwd=project, check=True)
    env_dir = project / "data" / "environments" / "tool_selection"
    env_dir.mkdir(parents=True)
    (env_dir / "tasks.jsonl").write_text("{}\n")

    version = versioning.commit_data(project, "data/environments/tool_selection")
    assert version == versioning.data_version(project, "data/environments/tool_selection")
    tracked = git(project, "ls-files")
    assert "data/environments/tool_selection.dvc" in tracked
    assert "README.md" not in git(project, "show", "--name-only", "HEAD")
    assert "A  README.md" in git(project, "status", "--porcelain")
