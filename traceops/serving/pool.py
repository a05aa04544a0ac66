"""The models one endpoint serves, found by the request's ``model`` (vLLM's convention for LoRA adapters).

A server started on a spec (``traceops.served``) serves that model as the default (a request without
``model`` gets it) and, when the home has a registry, beside it: the default's base model (prompted as
evaluation prompts it), the champion composite ``traceops.composite`` and every registered adapter
``traceops.adapter.<capability>`` (its ``champion`` version where it has one, else its latest). A
registered entry's id is its registered name; a request may also name it as ``name@alias`` or
``name/version`` (with or without ``models:/``) when that is the version it serves, or by the model id
its weights report. Only the default loads at start; the others load on their first request and stay,
up to ``serve.max_loaded_models`` models in memory (the default counts): a request for a model not
loaded when the cap is reached first unloads the least recently used loaded model that has nothing
queued or being generated (never the default), and when every one is busy it is answered 503 with
Retry-After (``PoolBusy``) rather than going over the cap. An unloaded model stays listed
(``traceops_loaded: false``) and loads again on its next request.
Each model loaded from the registry is its own copy of its base: the loaders fold an adapter into the
base weights (``merge``) and a composite wraps the base's layers in place, so two cannot share one.

Hot swap: ``reload`` re-reads every followed alias; where one moved to another version, that version is
loaded beside the old one, new requests go to it, and the old one's batcher answers what it had queued
and then lets its weights go. ``start_polling`` runs ``reload`` every ``poll_seconds``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from traceops import registry
from traceops.config import Paths
from traceops.errors import TraceopsError
from traceops.memory import release_memory
from traceops.model.base import ChatModel
from traceops.registry import ModelRef
from traceops.served import ServeTarget, load_target, registered_target
from traceops.serving.batcher import Batcher, QueueFull
from traceops.serving.domain import served_domain
from traceops.serving.params import ServeParams
from traceops.serving.requests import RequestError, check_prompt

Loader = Callable[[ServeTarget], ChatModel]


class PoolBusy(QueueFull):
    """``serve.max_loaded_models`` models are loaded and none can be unloaded now: retry after a moment."""


@dataclass
class Served:
    """One loaded model version and the batcher generating its requests; ``domain`` is the one its
    exchanges are logged under when the request names none (``serving.domain.served_domain``)."""

    model: ChatModel
    ref: ModelRef | None
    batcher: Batcher
    domain: str | None = None

    @property
    def fingerprint(self) -> str:
        """Which version answered: ``traceops.composite/3:<weights hash prefix>`` (the model id for an
        unregistered model); the response's ``system_fingerprint`` and ``X-Traceops-Model-Version``."""
        info = self.model.info
        who = f"{self.ref.name}/{self.ref.version}" if self.ref is not None else info.model_id
        return f"{who}:{info.weights_hash[:12]}"


@dataclass
class Entry:
    """One model the endpoint offers. ``follow`` is the registry spec re-read by ``reload``
    (``name@alias``, or a bare name for its latest version; None: fixed); ``ref`` the version served
    (or to be loaded); ``target`` set once resolved; ``served`` once loaded."""

    id: str
    kind: str
    follow: str | None = None
    ref: ModelRef | None = None
    aliases: tuple[str, ...] = ()
    target: ServeTarget | None = None
    served: Served | None = None
    weights_hash: str | None = None
    last_used: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def names(self) -> set[str]:
        """Every name a request may use for this entry."""
        names = {self.id}
        if self.ref is not None:
            forms = {self.ref.name, f"{self.ref.name}/{self.ref.version}",
                     *(f"{self.ref.name}@{alias}" for alias in self.aliases)}
            names |= forms | {f"models:/{form}" for form in forms}
        if self.served is not None:
            names.add(self.served.model.info.model_id)
        return names

    def describe(self, default: bool) -> dict[str, Any]:
        """The ``/v1/models`` item: OpenAI's fields plus the registered version, aliases, weights hash."""
        info = self.served.model.info if self.served is not None else None
        item: dict[str, Any] = {"id": self.id, "object": "model", "created": 0, "owned_by": "traceops",
                                "traceops_weights_hash": info.weights_hash if info else self.weights_hash,
                                "traceops_kind": self.kind, "traceops_loaded": self.served is not None,
                                "traceops_default": default}
        if info is not None:
            item["traceops_model_id"] = info.model_id
            item["traceops_fingerprint"] = self.served.fingerprint  # type: ignore[union-attr]
        if self.ref is not None:
            item["traceops_registered"] = {**self.ref.as_dict(), "aliases": list(self.aliases)}
        return item


def _follow_spec(target: ServeTarget) -> str | None:
    """What a registered target follows: its alias (``name@alias``), or None when a version was named."""
    if target.ref is None:
        return None
    text = target.spec.strip().removeprefix("models:/")
    return text if "@" in text else None


def _current(follow: str) -> ModelRef | None:
    """The version a followed spec names now (None when the alias or model is gone)."""
    if "@" in follow:
        name, _, alias = follow.partition("@")
        return registry.get_alias(name, alias)
    return registry.latest_version(follow)




def _aliases(ref: ModelRef) -> tuple[str, ...]:
    from mlflow import MlflowClient

    return tuple(sorted(MlflowClient().get_model_version(ref.name, ref.version).aliases or ()))


class ModelPool:
    """The entries of one endpoint (module docstring); thread-safe."""

    def __init__(self, entries: list[Entry], default: str, params: ServeParams | None = None,
                 paths: Paths | None = None, base_model: str | None = None,
                 loader: Loader | None = None) -> None:
        self.params = params or ServeParams()
        self.paths = paths
        self.base_model = base_model
        self.default = default
        self._entries = {entry.id: entry for entry in entries}
        self._loader = loader or (lambda target: load_target(target, batch_size=self.params.max_batch))
        self._reload_lock = threading.Lock()
        self._load_lock = threading.Lock()  # loads one at a time, so the cap holds under concurrency
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    # Construction ------------------------------------------------------------------------------------

    def _served(self, model: ChatModel, ref: ModelRef | None) -> Served:
        name = ref.name if ref is not None else model.info.model_id
        batcher = Batcher(model, queue_size=self.params.queue_size,
                          window_s=self.params.batch_window_ms / 1000,
                          max_batch=self.params.max_batch, check=check_prompt, name=name)
        return Served(model=model, ref=ref, batcher=batcher,
                      domain=served_domain(ref, self.paths, self.params.domain))

    @classmethod
    def single(cls, model: ChatModel, registered: ModelRef | None = None,
               params: ServeParams | None = None) -> ModelPool:
        """A pool serving one already-loaded model under its model id."""
        entry = Entry(id=model.info.model_id, kind=str(model.info.extra.get("kind", "model")), ref=registered)
        pool = cls([entry], entry.id, params)
        entry.served = pool._served(model, registered)
        return pool

    @classmethod
    def from_target(cls, target: ServeTarget, paths: Paths, params: ServeParams | None = None,
                    base_model: str | None = None, loader: Loader | None = None) -> ModelPool:
        """The pool for a resolved serve spec: the target loaded now as the default, its base and (when the
        home has a registry) the champion composite and every adapter listed, loaded on first use."""
        follow = _follow_spec(target)
        pool = cls([], "", params, paths, base_model, loader)
        served = pool._served(pool._loader(target), target.ref)
        ref = target.ref
        default_id = ((ref.name if follow else f"{ref.name}/{ref.version}") if ref
                      else served.model.info.model_id)
        default = Entry(id=default_id, kind=target.kind, follow=follow, ref=ref, target=target,
                        served=served, aliases=_aliases(ref) if ref else ())
        pool._entries[default.id] = default
        pool.default = default.id
        if target.base_model_dir is not None:
            from traceops.model.adapted import base_info  # the id and hash evaluation records for a base

            base_id, weights = base_info(target.base_model_dir)
            base_dir = target.base_model_dir
            base = ServeTarget(spec=str(base_dir), kind="base", base_model_dir=base_dir)
            pool._entries.setdefault(base_id, Entry(id=base_id, kind="base", target=base,
                                                    weights_hash=weights))
        if (paths.mlflow / "mlflow.db").is_file():
            pool._add_registered()
        return pool

    def _add_registered(self) -> None:
        """Entries for the champion composite and every registered adapter not listed yet."""
        from mlflow import MlflowClient

        assert self.paths is not None
        registry.configure(self.paths)
        followed = {entry.follow for entry in self._entries.values() if entry.follow}
        names = {model.name: model for model in MlflowClient().search_registered_models()}
        wanted: list[tuple[str, str]] = []
        if registry.COMPOSITE_MODEL in names and registry.CHAMPION in (names[registry.COMPOSITE_MODEL].aliases
                                                                       or {}):
            wanted.append((f"{registry.COMPOSITE_MODEL}@{registry.CHAMPION}", "composite"))
        for name in sorted(n for n in names if n.startswith(registry.ADAPTER_PREFIX)):
            champion = registry.CHAMPION in (names[name].aliases or {})
            wanted.append((f"{name}@{registry.CHAMPION}" if champion else name, "adapter"))
        for follow, kind in wanted:
            name = follow.partition("@")[0]
            ref = _current(follow)
            if follow in followed or name in self._entries or ref is None:
                continue
            self._entries[name] = Entry(id=name, kind=kind, follow=follow, ref=ref, aliases=_aliases(ref))

    # Requests ----------------------------------------------------------------------------------------

    @property
    def ids(self) -> list[str]:
        """The ids ``/v1/models`` lists, the default first."""
        ids = list(self._entries)  # a copy: reload may add entries meanwhile
        return [self.default, *sorted(i for i in ids if i != self.default)]

    def entry(self, model: str | None) -> Entry:
        """The entry a request's ``model`` names (the default when None); RequestError 404 listing the
        ids otherwise."""
        if model is None or not model.strip():
            return self._entries[self.default]
        name = model.strip()
        if name in self._entries:
            return self._entries[name]
        for entry in list(self._entries.values()):
            if name in entry.names():
                return entry
        served = {e.ref.name: e for e in self._entries.values() if e.ref is not None}
        base = name.removeprefix("models:/").partition("@")[0].rpartition("/")[0] or \
            name.removeprefix("models:/").partition("@")[0]
        hint = ""
        if base in served:
            entry = served[base]
            hint = (f"; {base} is served at version {entry.ref.version} "  # type: ignore[union-attr]
                    f"(aliases {', '.join(entry.aliases) or 'none'}) only")
        raise RequestError(f"model '{name}' is not served{hint}; send one of: {', '.join(self.ids)} "
                           "(or leave model out for the default)", status=404)

    def serving(self, entry: Entry) -> Served:
        """The loaded version of ``entry``, loading it on first use (unloading the least recently used idle
        model first when ``max_loaded_models`` are loaded; ``PoolBusy`` when none is idle)."""
        entry.last_used = time.monotonic()
        served = entry.served
        if served is not None:
            return served
        with self._load_lock:
            if entry.served is None:
                self._make_room(entry)
                target = entry.target or self._resolve(entry.ref)
                model = self._loader(target)
                with entry.lock:
                    entry.target, entry.served = target, self._served(model, entry.ref)
            return entry.served  # type: ignore[return-value]

    @property
    def loaded(self) -> list[str]:
        """The ids of the entries loaded now."""
        return [e.id for e in list(self._entries.values()) if e.served is not None]

    def _make_room(self, entry: Entry) -> None:
        """Unload least recently used idle entries until ``entry`` fits under the cap (``_load_lock``
        held)."""
        cap = self.params.max_loaded_models
        if cap is None:
            return
        loaded = [e for e in list(self._entries.values()) if e.served is not None]
        candidates = sorted((e for e in loaded if e.id != self.default and e is not entry),
                            key=lambda e: e.last_used)
        excess = len(loaded) + 1 - cap
        for candidate in candidates:
            if excess <= 0:
                return
            if self.unload(candidate):
                excess -= 1
        if excess > 0:
            if not candidates:
                raise PoolBusy(f"{entry.id} cannot load: serve.max_loaded_models is {cap} and the default "
                               f"model {self.default} takes it; raise serve.max_loaded_models to serve "
                               "other models beside it")
            raise PoolBusy(f"{entry.id} is not loaded and all {len(loaded)} loaded models "
                           f"({', '.join(e.id for e in loaded)}) have requests queued or running "
                           f"(serve.max_loaded_models is {cap}); retry after a moment")

    def unload(self, entry: Entry) -> bool:
        """Let ``entry``'s weights go when it has nothing queued or being generated (it loads again on its
        next request); whether it did. The default entry is never unloaded."""
        served = entry.served
        if entry.id == self.default or served is None or not served.batcher.close_if_idle():
            return False
        with entry.lock:
            if entry.served is served:
                entry.served = None
        served.batcher.close(wait=True)  # idle: the worker exits at once and drops its model
        sys.stderr.write(f"traceops serve: unloaded {entry.id} ({served.fingerprint}) to stay within "
                         f"serve.max_loaded_models={self.params.max_loaded_models}\n")
        del served
        release_memory()
        return True

    def _resolve(self, ref: ModelRef | None) -> ServeTarget:
        if ref is None or self.paths is None:
            raise RequestError("this model has nothing to load; send another model", status=500)
        return registered_target(f"{ref.name}/{ref.version}", self.paths, self.base_model)

    def listing(self) -> list[dict[str, Any]]:
        """The ``/v1/models`` items, the default first."""
        return [self._entries[i].describe(i == self.default) for i in self.ids]

    # Hot swap ----------------------------------------------------------------------------------------

    def reload(self) -> list[dict[str, Any]]:
        """Re-read every followed alias and swap each loaded entry whose version moved (module docstring).

        Returns one item per entry that changed (``model``, ``from``, ``to``, ``loaded``) or could not be
        loaded (``error``; the old version keeps serving). New registered models get entries.
        """
        if self.paths is None or not (self.paths.mlflow / "mlflow.db").is_file():
            return []
        with self._reload_lock:
            registry.configure(self.paths)
            self._add_registered()
            changes: list[dict[str, Any]] = []
            for entry in list(self._entries.values()):
                if entry.ref is None:
                    continue
                ref = _current(entry.follow) if entry.follow else entry.ref
                if ref is None or ref.version == entry.ref.version:
                    entry.aliases = _aliases(entry.ref)
                    continue
                change: dict[str, Any] = {"model": entry.id, "from": entry.ref.version, "to": ref.version,
                                          "loaded": entry.served is not None}
                try:
                    self._swap(entry, ref)
                except TraceopsError as exc:
                    sys.stderr.write(f"traceops serve: could not load {ref.uri} for {entry.id}: {exc}; "
                                     f"still serving version {entry.ref.version}\n")
                    change["error"] = str(exc)
                changes.append(change)
            return changes

    def _swap(self, entry: Entry, ref: ModelRef) -> None:
        """Point ``entry`` at ``ref``: loaded beside the old version first when the old one is loaded."""
        aliases = _aliases(ref)
        if entry.served is None:
            with entry.lock:
                entry.ref, entry.aliases, entry.target = ref, aliases, None
            return
        target = registered_target(f"{ref.name}/{ref.version}", self.paths, self.base_model)  # type: ignore[arg-type]
        new = self._served(self._loader(target), ref)
        with entry.lock:
            old = entry.served
            entry.served, entry.ref, entry.aliases, entry.target = new, ref, aliases, target
        sys.stderr.write(f"traceops serve: {entry.id} now serves {new.fingerprint} (was {old.fingerprint})\n")
        old.batcher.close()  # answers what it queued, then drops the old weights

    def start_polling(self, seconds: float | None = None) -> None:
        """Run ``reload`` every ``seconds`` (default ``params.poll_seconds``; 0 or no registry: never)."""
        seconds = self.params.poll_seconds if seconds is None else seconds
        if seconds <= 0 or self.paths is None or self._poller is not None:
            return

        def poll() -> None:
            while not self._stop.wait(seconds):
                try:
                    self.reload()
                except Exception as exc:  # noqa: BLE001 - a failed poll must not stop the next one
                    sys.stderr.write(f"traceops serve: polling the registry failed: {exc}\n")

        self._poller = threading.Thread(target=poll, name="traceops-serve-poll", daemon=True)
        self._poller.start()

    def close(self) -> None:
        """Stop polling and every batcher (queued requests are still answered)."""
        self._stop.set()
        for entry in self._entries.values():
            if entry.served is not None:
                entry.served.batcher.close()
