"""Shared fixtures: every test runs against a temporary state home, never the project's own."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty traceops home; TRACEOPS_HOME points at it for the test's duration."""
    root = tmp_path / "home"
    root.mkdir()
    monkeypatch.setenv("TRACEOPS_HOME", str(root))
    monkeypatch.setenv("PREFECT_HOME", str(root / ".prefect"))
    return root
