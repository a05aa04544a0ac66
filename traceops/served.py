"""What ``traceops serve`` serves: a serve spec resolved to a model and the base it runs on.

A spec is one of:

- nothing: the home's ``traceops.composite@champion`` when its registry has that alias, else ``embedded``;
- a registry reference (``traceops.composite@champion``, ``traceops.adapter.<capability>/3``, either with
  ``models:/`` in front): the version is downloaded into the home's download cache and its base model
  is the spec recorded on the version (``traceops.base_model_spec``), weights hash checked;
- an adapter folder (``adapter_config.json``) or a composite folder (``moe_config.json``): the base is
  the one the folder records (PEFT's ``base_model_name_or_path``, the composite's ``composite.json``)
  unless ``base_model`` names one;
- anything else ``traceops.model.load_model`` understands (``embedded``, a HF folder, a URL), as before.

Adapters and composites are loaded with the loaders evaluation uses (``traceops.model.adapted``), so a
served model is prompted exactly as it was evaluated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from traceops import registry
from traceops.config import Paths
from traceops.errors import ConfigError
from traceops.model.base import ChatModel
from traceops.registry import ModelRef
from traceops.tags import TAG_BASE_MODEL, TAG_BASE_SPEC

DEFAULT_REF = f"{registry.COMPOSITE_MODEL}@{registry.CHAMPION}"
FALLBACK_SPEC = "embedded"
ADAPTER_CONFIG = "adapter_config.json"
MOE_CONFIG = "moe_config.json"
COMPOSITE_INFO = "composite.json"  # traceops.compose.COMPOSITE_INFO; not imported to keep torch out


@dataclass(frozen=True)
class ServeTarget:
    """A resolved serve spec. ``kind`` is ``adapter``, ``composite``, ``base`` (the folder adapters run
    on, loaded as evaluation loads it) or ``model`` (a spec handed to ``load_model`` as is); adapters
    and composites have their ``folder`` and ``base_model_dir``;
    ``ref`` is the registered version served, if any; ``defaulted`` says no spec was given."""

    spec: str
    kind: str
    folder: Path | None = None
    base_model_dir: Path | None = None
    ref: ModelRef | None = None
    defaulted: bool = False

    def describe(self) -> str:
        """One sentence for the server's start-up line: what is served, and why when it was a default."""
        what = (f"{self.ref.name} version {self.ref.version} ({self.kind}, {self.spec})" if self.ref
                else f"{self.kind} {self.folder}" if self.folder else self.spec)
        if self.base_model_dir is not None:
            what += f" on base {self.base_model_dir}"
        if self.defaulted:
            why = ("the home's champion" if self.ref
                   else f"no spec and no {DEFAULT_REF} in the home's registry")
            what += f" ({why})"
        return what


def _has_store(paths: Paths) -> bool:
    """Whether the home has a registry; checked first so resolving never creates a store in a stray cwd."""
    return (paths.mlflow / "mlflow.db").is_file()


def is_registry_ref(spec: str) -> bool:
    """Whether ``spec`` reads as a registry reference rather than a folder, a URL or a Hub id:
    ``models:/...``, ``<name>@<alias>`` or ``<name>/<version number>``."""
    text = spec.strip()
    if text.startswith(("http://", "https://")) or Path(text).expanduser().exists():
        return False
    if text.startswith("models:/") or "@" in text:
        return True
    _name, sep, version = text.rpartition("/")
    return bool(sep) and version.isdigit()


def _folder_kind(folder: Path) -> str | None:
    if (folder / ADAPTER_CONFIG).is_file():
        return "adapter"
    if (folder / MOE_CONFIG).is_file():
        return "composite"
    return None


def _recorded_base(folder: Path, kind: str) -> tuple[str | None, str | None]:
    """The base model spec an adapter or composite folder records, and the ``<model id>@<weights sha256>``
    it was built on when the folder records that too (the compose stage's ``composite.json``)."""
    if kind == "adapter":
        return json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or None, None
    for name in (COMPOSITE_INFO, MOE_CONFIG):  # the compose stage's spec first, then save_moe's record
        if (folder / name).is_file():
            recorded = json.loads((folder / name).read_text())
            if recorded.get("base_model"):
                return str(recorded["base_model"]), recorded.get("base_model_ref") or None
    return None, None


def _base_dir(spec: str, expected_ref: str | None) -> Path:
    """The local folder of base ``spec``, its weights checked against ``expected_ref`` when given (as the
    registered pyfunc models check theirs)."""
    from traceops.mlflow_models import base_model_dir

    return base_model_dir({"base_model": spec, "base_model_ref": expected_ref})


def registered_target(spec: str, paths: Paths, base_model: str | None = None,
                      defaulted: bool = False) -> ServeTarget:
    """The target of registry reference ``spec``: the version downloaded into the home's cache, on the
    base it records (``base_model`` overrides it). Raises ConfigError naming what exists."""
    if not _has_store(paths):
        raise ConfigError(f"'{spec}' is a registry reference, but the home {paths.home} has no registry "
                          "(mlflow/mlflow.db); pass --home with the home that registered it, or serve a "
                          "folder or 'embedded'")
    registry.configure(paths)
    try:
        ref = registry.resolve_ref(spec)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; serve one of those, an adapter or composite folder, "
                          "or 'embedded'") from exc
    folder = registry.download_version(paths, ref)
    kind = _folder_kind(folder)
    if kind is None:
        raise ConfigError(f"{ref.uri} holds neither an adapter ({ADAPTER_CONFIG}) nor a composite "
                          f"({MOE_CONFIG}); serve a traceops.adapter.<capability> or traceops.composite "
                          "version")
    tags = registry.version_tags(ref)
    base_spec = base_model or tags.get(TAG_BASE_SPEC)
    if not base_spec:
        raise ConfigError(f"{ref.uri} records no base model spec ({TAG_BASE_SPEC}); pass --base-model")
    return ServeTarget(spec=spec, kind=kind, folder=folder, ref=ref, defaulted=defaulted,
                       base_model_dir=_base_dir(base_spec, tags.get(TAG_BASE_MODEL)))


def resolve_serve_spec(spec: str | None, paths: Paths, base_model: str | None = None) -> ServeTarget:
    """Resolve a serve spec (module docstring) against the home at ``paths``; nothing is loaded.

    Raises ConfigError naming what exists for a reference that does not resolve, and when
    ``base_model`` is given for a spec that runs on no separate base.
    """
    text = (spec or "").strip()
    if not text:
        if _has_store(paths):
            registry.configure(paths)
            if registry.get_alias(registry.COMPOSITE_MODEL, registry.CHAMPION) is not None:
                return registered_target(DEFAULT_REF, paths, base_model, defaulted=True)
        text = FALLBACK_SPEC
        if base_model is not None:
            raise ConfigError(f"--base-model applies to adapters and composites, and the home has no "
                              f"{DEFAULT_REF}; serve the base itself as the spec instead")
        return ServeTarget(spec=text, kind="model", defaulted=True)
    folder = Path(text).expanduser()
    kind = _folder_kind(folder) if folder.is_dir() else None
    if kind is not None:
        recorded, expected_ref = _recorded_base(folder, kind)
        base_spec = base_model or recorded
        if not base_spec:
            raise ConfigError(f"{folder} records no base model; pass --base-model embedded or the model "
                              f"folder the {kind} was trained on")
        return ServeTarget(spec=text, kind=kind, folder=folder.resolve(),
                           base_model_dir=_base_dir(base_spec, expected_ref))
    if is_registry_ref(text):
        return registered_target(text, paths, base_model)
    if base_model is not None:
        raise ConfigError(f"--base-model applies to adapters and composites; '{text}' is neither (an adapter "
                          f"folder has {ADAPTER_CONFIG}, a composite folder {MOE_CONFIG})")
    return ServeTarget(spec=text, kind="model")


def load_target(target: ServeTarget, batch_size: int = 8) -> ChatModel:
    """The ChatModel of a resolved target: adapters, composites and a ``base`` (the folder an adapter or
    composite runs on) through evaluation's loaders (prompted as evaluated), any other spec through
    ``load_model``."""
    if target.kind == "model":
        from traceops.model import load_model

        return load_model(target.spec, batch_size=batch_size)
    from traceops.model.adapted import load_adapter_model, load_base_model, load_composite_model

    if target.kind == "base" and target.base_model_dir is not None:
        return load_base_model(target.base_model_dir, batch_size=batch_size)
    if target.folder is None or target.base_model_dir is None:
        raise ConfigError(f"a {target.kind} target needs its folder and base; resolve it with "
                          "resolve_serve_spec")
    if target.kind == "adapter":
        return load_adapter_model(target.base_model_dir, target.folder, batch_size=batch_size)
    return load_composite_model(target.base_model_dir, target.folder, batch_size=batch_size)
