"""Rollback: move a registered model's ``champion`` alias back, and say who did it, why and when.

``plan(name, to)`` picks the versions: the current champion and the version to return to (``to``, else
the one ``previous`` points at), with an error that says what to do when there is nothing to roll back
to. ``apply(plan, by, reason, at, run_id)`` moves the aliases:

* ``champion`` -> the target version; the version that lost it gets ``rolled_back``;
* ``previous`` is removed when it pointed at the target: it named the version now restored, and a
  second rollback without ``--to`` must not silently re-promote the version just rolled back;

and tags both versions with ``traceops.rollback_by``/``_reason``/``_at``/``_run`` (``tags.py``), plus
``traceops.rolled_back_to`` on the loser and ``traceops.rollback_from`` on the restored one (each
clears the other, so a version's tags describe the latest rollback that moved it). The lineage audit
shows them. A server that follows ``champion`` swaps back as after a promotion.

The MLflow run that records the event is opened by the caller (``traceops.tasks.rollback``).
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass

from traceops import registry
from traceops.errors import ConfigError
from traceops.registry import CHAMPION, PREVIOUS, ModelRef
from traceops.results import RollbackResult, VersionRef
from traceops.tags import (
    TAG_ROLLBACK_AT,
    TAG_ROLLBACK_BY,
    TAG_ROLLBACK_FROM,
    TAG_ROLLBACK_REASON,
    TAG_ROLLBACK_RUN,
    TAG_ROLLED_BACK_TO,
)

ROLLED_BACK = "rolled_back"  # alias of the version a rollback took champion away from (the latest)
USER_ENV = "TRACEOPS_USER"


class RollbackError(ConfigError):
    """Nothing to roll back, or nothing to roll back to."""


@dataclass(frozen=True)
class RollbackPlan:
    """The champion now and the version that gets champion back."""

    name: str
    current: ModelRef
    target: ModelRef


def user() -> str:
    """Who rolls back: ``TRACEOPS_USER`` when set, else the login name."""
    return os.environ.get(USER_ENV) or getpass.getuser()


def plan(name: str, reason: str, to: str | None = None) -> RollbackPlan:
    """The rollback of ``name`` to version ``to`` (default: the ``previous`` alias), checked before
    anything moves.

    Raises ``RollbackError`` for an empty reason, no champion, no previous version and no ``to``, or a
    target that already is the champion; ``ConfigError`` for a version that does not exist.
    """
    if not reason.strip():
        raise RollbackError("a rollback needs a reason: pass --reason TEXT (what is wrong with the champion)")
    try:
        current = registry.resolve_ref(f"{name}@{CHAMPION}")
    except ConfigError as error:
        raise RollbackError(f"{name} has no champion to roll back ({error})") from None
    if to is None:
        try:
            target = registry.resolve_ref(f"{name}@{PREVIOUS}")
        except ConfigError as error:
            raise RollbackError(
                f"nothing to roll back to: no promotion replaced a champion, or a rollback already used "
                f"'{PREVIOUS}'; pass --to VERSION ({error})") from None
    else:
        target = registry.get_version(name, str(to).strip())
    if target.version == current.version:
        raise RollbackError(f"{name} version {target.version} already is the champion; nothing to roll back. "
                            "Pass --to with another version")
    return RollbackPlan(name=name, current=current, target=target)


def apply(rollback: RollbackPlan, by: str, reason: str, at: str, run_id: str) -> RollbackResult:
    """Move the aliases and tag both versions (see the module docstring); returns what was done."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()  # on the URIs registry.configure set
    name, current, target = rollback.name, rollback.current, rollback.target
    event = {TAG_ROLLBACK_BY: by, TAG_ROLLBACK_REASON: reason, TAG_ROLLBACK_AT: at, TAG_ROLLBACK_RUN: run_id}
    moves = ((current.version, TAG_ROLLED_BACK_TO, target.version, TAG_ROLLBACK_FROM),
             (target.version, TAG_ROLLBACK_FROM, current.version, TAG_ROLLED_BACK_TO))
    for version, tag, value, stale in moves:
        for key, text in {**event, tag: value}.items():
            client.set_model_version_tag(name, version, key, text)
        if stale in (client.get_model_version(name, version).tags or {}):
            client.delete_model_version_tag(name, version, stale)
    client.set_registered_model_alias(name, CHAMPION, target.version)
    client.set_registered_model_alias(name, ROLLED_BACK, current.version)
    previous = registry.get_alias(name, PREVIOUS)
    if previous is not None and previous.version == target.version:
        client.delete_registered_model_alias(name, PREVIOUS)
    aliases = {k: str(v) for k, v in sorted((client.get_registered_model(name).aliases or {}).items())}
    return RollbackResult(name=name, rolled_back=VersionRef(name=name, version=current.version),
                          champion=VersionRef(name=name, version=target.version), by=by, reason=reason,
                          at=at, aliases=aliases, mlflow_run=run_id)
