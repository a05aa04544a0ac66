"""Retry policy shared by stage tasks: retry transient failures, never a user's bad input or config."""

from __future__ import annotations

from typing import Any

from traceops.errors import ConfigError, InputError, ModelError


def retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: False for errors a retry cannot fix (bad input, config, model)."""
    try:
        state.result()
    except (ConfigError, InputError, ModelError):
        return False
    except Exception:
        return True
    return True
