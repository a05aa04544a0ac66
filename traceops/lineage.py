"""Lineage of a registered model version: the tags it is registered with, and its audit trail (every
input, hash and run behind it, each link verified).

``current_lineage`` gives the lineage tags of what is on disk now (git sha, base model, DVC versions of
the curated data and environments, diagnosis run); every registered version carries them.

``lineage(paths, "traceops.composite@champion")`` walks

    composite version -> router and adapter versions (``traceops.parent_versions``)
      -> per version: its source run, base model (weights hash re-computed), git commit,
         env_version (DVC ``.dir`` object in the home's cache or local remote, its file list),
         diagnosis run, data_version (curated, DVC) -> the ingest runs behind it -> raw files

and returns a tree of nodes ``{"kind", "name", "ok", "detail", "children", ...}``. A subtree met twice
(adapters share their data version, the router shares the composite's adapters) is listed once and
then referenced (``"ref": true``). Raw log files that are gone or changed since ingest are *warnings*
(``"warning": true``): logs get rotated, and the curated data version still pins what was read; every
other failed link makes the top-level ``ok`` false and is listed in ``broken``.

The curated store grows by appending, so a data version holds what every earlier ingest run added:
the ingest runs listed are those that recorded this version plus the finished ones before them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceops import registry
from traceops.config import Paths
from traceops.errors import ConfigError
from traceops.hashing import content_hash, file_hash
from traceops.model.reference import resolve_base_model
from traceops.tags import (
    LINEAGE_KEYS,
    TAG_BASE_MODEL,
    TAG_BASE_SPEC,
    TAG_CAPABILITY,
    TAG_DATA_VERSION,
    TAG_DIAGNOSIS_RUN,
    TAG_ENV_VERSION,
    TAG_GIT_SHA,
    TAG_PARENT_VERSIONS,
    TAG_RAW_FILES,
    TAG_ROLLBACK_AT,
    TAG_ROLLBACK_BY,
    TAG_ROLLBACK_FROM,
    TAG_ROLLBACK_REASON,
    TAG_ROLLBACK_RUN,
    TAG_ROLLED_BACK_TO,
    TAG_SOURCE_RUN,
)

RAW_FILES_ARTIFACT = "raw_files.json"  # the ingest run's raw-files manifest, pinned by TAG_RAW_FILES
RAW_WARNING = ("warning only: raw logs may be rotated or moved away; the curated data version still "
               "pins the content that was ingested")
_MAX_LISTED_FILES = 200  # per DVC folder in the tree; counts are always complete


class LineageError(ConfigError):
    """The model reference cannot be audited (unknown model, version or alias)."""


# -- raw-file manifests (written by the ingest task) ----------------------------------------------------

def raw_files_manifest(inputs: Sequence[str | Path], home: str | Path) -> list[dict[str, Any]]:
    """Every file ingest reads from ``inputs`` (folders expanded like the readers do, each log followed by
    its outcomes side file when it has one): its path
    (relative to ``home`` when inside it, else absolute), sha256 and size in bytes."""
    from traceops.formats.detect import iter_files
    from traceops.formats.outcomes import side_outcomes_file

    root = Path(home).resolve()
    entries = []
    files = []
    for file in iter_files(list(inputs)):
        side = side_outcomes_file(file)  # a served log's feedback is an input of the same records
        files.extend([file] if side is None else [file, side])
    for file in files:
        resolved = file.resolve()
        try:
            path = resolved.relative_to(root).as_posix()
        except ValueError:
            path = str(resolved)
        entries.append({"path": path, "sha256": file_hash(resolved), "size": resolved.stat().st_size})
    return entries


def manifest_hash(entries: list[dict[str, Any]]) -> str:
    """sha256 of a raw-files manifest's canonical JSON: the tag that pins it on the ingest run."""
    return content_hash(entries, length=64)


# -- lineage tags of what is on disk now (set on every registered version and stage run) ---------------

def git_sha(root: Path) -> str:
    """The commit of the code that ran: the traceops source checkout's HEAD, or ``unknown``."""
    source = Path(__file__).resolve().parent.parent
    for folder in (source, root):
        try:
            out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                                 text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return "unknown"


def _diagnosis_run_of(paths: Paths, env_version: str | None) -> str:
    """The diagnosis run behind ``env_version``: the tag of the synthesize run that wrote that version."""
    if not env_version:
        return ""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    found = client.get_experiment_by_name(registry.experiment_name("synthesize"))
    if found is None:
        return ""
    runs = client.search_runs([found.experiment_id], f"tags.`{TAG_ENV_VERSION}` = '{env_version}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].data.tags.get(TAG_DIAGNOSIS_RUN, "") if runs else ""


def current_lineage(paths: Paths, base_model: str, diagnosis_run: str | None = None) -> dict[str, str]:
    """Lineage tags of what is on disk now: git sha, base model, curated data and environments versions
    (DVC md5s) and the diagnosis run behind those environments."""
    from traceops import versioning

    _folder, base_ref = resolve_base_model(base_model)
    data_version = versioning.data_version(paths.home, "data/curated") or ""
    env_version = versioning.data_version(paths.home, "data/environments") or ""
    if diagnosis_run is None:
        diagnosis_run = _diagnosis_run_of(paths, env_version)
    return {
        TAG_GIT_SHA: git_sha(paths.home),
        TAG_BASE_MODEL: base_ref,
        TAG_DATA_VERSION: data_version,
        TAG_ENV_VERSION: env_version,
        TAG_DIAGNOSIS_RUN: diagnosis_run,
    }


# -- tree nodes ----------------------------------------------------------------------------------------

def _node(kind: str, name: str, ok: bool, detail: str, children: list[dict[str, Any]] | None = None,
          **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "name": name, "ok": bool(ok), "detail": detail, "children": children or [],
            **extra}


class _Audit:
    """One lineage walk: MLflow client, DVC locations and the subtrees already listed."""

    def __init__(self, paths: Paths) -> None:
        from mlflow.tracking import MlflowClient

        self.paths = paths
        self.client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
        self.seen: dict[str, dict[str, Any]] = {}
        self.raw_seen: set[tuple[str, str]] = set()
        self._dvc: tuple[Path | None, Path | None] | None = None

    def once(self, key: str, build: Any) -> dict[str, Any]:
        """The subtree for ``key``: built the first time, a reference to it afterwards."""
        if key in self.seen:
            first = self.seen[key]
            return _node(first["kind"], first["name"], first["ok"], "listed above", ref=True,
                         warning=first.get("warning", False))
        node = build()
        self.seen[key] = node
        return node

    # -- model versions ------------------------------------------------------------------------------
    def version(self, name: str, version: str) -> dict[str, Any]:
        return self.once(f"version:{name}/{version}", lambda: self._version(name, version))

    def _version(self, name: str, version: str) -> dict[str, Any]:
        from mlflow.exceptions import MlflowException


        label = f"{name}/{version}"
        try:
            mv = self.client.get_model_version(name, version)
        except MlflowException:
            return _node("model_version", label, False, "registered version does not exist")
        tags = dict(mv.tags or {})
        children = [self._artifacts(name, version)]
        parents_text = tags.get(TAG_PARENT_VERSIONS)
        if parents_text:
            try:
                parents = json.loads(parents_text)
            except json.JSONDecodeError:
                children.append(_node("parents", TAG_PARENT_VERSIONS, False,
                                      f"not valid JSON: {parents_text[:80]}"))
            else:
                children += [self.version(p, str(v)) for p, v in sorted(parents.items())]
        run_id = tags.get(TAG_SOURCE_RUN) or mv.run_id or ""
        children.append(self.run(run_id, "source run", "training/route run that logged this version"))
        children.append(self.base_model(tags.get(TAG_BASE_MODEL, ""),
                                        tags.get(TAG_BASE_SPEC, "")))
        children.append(self.git(tags.get(TAG_GIT_SHA, "")))
        capability = tags.get(TAG_CAPABILITY)
        children.append(self.dvc("env_version", "data/environments", tags.get(TAG_ENV_VERSION, ""),
                                 capability))
        children.append(self.run(tags.get(TAG_DIAGNOSIS_RUN, ""), "diagnosis run",
                                 "diagnose stage run behind the environments"))
        children.append(self.data_version(tags.get(TAG_DATA_VERSION, "")))
        if TAG_ROLLBACK_RUN in tags:
            children.append(self._rollback(tags))
        missing = [k for k in LINEAGE_KEYS if k not in tags]
        detail = f"run {run_id}" + (f"; missing tags: {', '.join(missing)}" if missing else "")
        return _node("model_version", label, not missing, detail, children, capability=capability,
                     run_id=run_id, aliases=list(getattr(mv, "aliases", []) or []))

    def _rollback(self, tags: dict[str, str]) -> dict[str, Any]:
        """The latest `traceops rollback` that moved this version's champion alias: who, why, when."""
        if TAG_ROLLED_BACK_TO in tags:
            what = f"rolled back: champion moved to version {tags[TAG_ROLLED_BACK_TO]}"
        else:
            what = f"champion again by rollback from version {tags.get(TAG_ROLLBACK_FROM, '?')}"
        detail = (f"{what} by {tags.get(TAG_ROLLBACK_BY, '?')} at {tags.get(TAG_ROLLBACK_AT, '?')}: "
                  f"{tags.get(TAG_ROLLBACK_REASON, '')}")
        run = self.run(tags[TAG_ROLLBACK_RUN], "rollback run", "the run that recorded the rollback")
        return _node("rollback", "rollback", run["ok"], detail, [run], by=tags.get(TAG_ROLLBACK_BY),
                     reason=tags.get(TAG_ROLLBACK_REASON), at=tags.get(TAG_ROLLBACK_AT))

    def _artifacts(self, name: str, version: str) -> dict[str, Any]:
        """The version's logged files (MLmodel and the adapter/composite folder) still exist."""
        import mlflow

        try:
            uri = self.client.get_model_version_download_uri(name, version)
            listed = mlflow.artifacts.list_artifacts(artifact_uri=uri)
        except Exception as exc:  # any store error means the artifacts cannot be reached
            return _node("artifacts", f"{name}/{version}", False, f"artifacts unreadable: {exc}")
        names = sorted(Path(item.path).name for item in listed)
        ok = "MLmodel" in names and "artifacts" in names
        return _node("artifacts", uri, ok, "MLmodel and model folder present" if ok
                     else f"incomplete model artifacts: {', '.join(names) or 'none'}")

    # -- runs --------------------------------------------------------------------------------------
    def run(self, run_id: str, role: str, what: str) -> dict[str, Any]:
        if not run_id:
            return _node("run", role, False, f"no {role} recorded ({what})")
        return self.once(f"run:{run_id}", lambda: self._run(run_id, role))

    def _run(self, run_id: str, role: str) -> dict[str, Any]:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return _node("run", f"{role} {run_id}", False, "run does not exist in the MLflow store")
        experiment = self.client.get_experiment(run.info.experiment_id)
        return _node("run", f"{role} {run_id}", True,
                     f"{experiment.name if experiment else run.info.experiment_id}, {run.info.status}",
                     run_id=run_id, experiment=experiment.name if experiment else None)

    # -- base model and code ---------------------------------------------------------------------------
    def base_model(self, ref: str, spec: str) -> dict[str, Any]:
        return self.once(f"base:{ref}:{spec}", lambda: self._base_model(ref, spec))

    def _base_model(self, ref: str, spec: str) -> dict[str, Any]:
        from traceops.errors import TraceopsError

        if not ref:
            return _node("base_model", "base model", False, "no base model recorded")
        if not spec:
            return _node("base_model", ref, False, "no base model spec recorded: cannot re-hash the weights")
        try:
            folder, resolved = resolve_base_model(spec)
        except TraceopsError as exc:
            return _node("base_model", ref, False, f"'{spec}' does not resolve here: {exc}")
        if resolved != ref:
            return _node("base_model", ref, False,
                         f"'{spec}' now has weights {resolved}: changed since training")
        return _node("base_model", ref, True, f"weights hash matches ({folder})", spec=spec)

    def git(self, sha: str) -> dict[str, Any]:
        return self.once(f"git:{sha}", lambda: self._git(sha))

    def _git(self, sha: str) -> dict[str, Any]:
        if not sha or sha == "unknown":
            return _node("git", "git commit", False, "no commit recorded (code ran outside a git checkout)")
        source = Path(__file__).resolve().parent.parent
        checked = []
        for folder in (source, self.paths.home):
            try:
                proc = subprocess.run(["git", "-C", str(folder), "cat-file", "-e", f"{sha}^{{commit}}"],
                                      capture_output=True, text=True, timeout=10, check=False)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if proc.returncode == 0:
                return _node("git", sha, True, f"commit exists in {folder}")
            checked.append(str(folder))
        return _node("git", sha, False, f"commit not found in {', '.join(checked) or 'any git repository'}")

    # -- DVC-versioned folders ---------------------------------------------------------------------------
    def _dvc_dirs(self) -> tuple[Path | None, Path | None]:
        """(cache objects folder, local remote objects folder) of the home's DVC repository."""
        if self._dvc is None:
            cache = remote = None
            if (self.paths.home / ".dvc").is_dir():
                from dvc.repo import Repo

                with Repo(str(self.paths.home)) as repo:
                    cache = Path(repo.cache.local.path)
                    default = repo.config["core"].get("remote")
                    url = (repo.config["remote"].get(default) or {}).get("url") if default else None
                if url and "://" not in url:
                    # DVC 3 lays out remotes like the cache: files/md5/<2 chars>/<rest>
                    remote = Path(url) / cache.relative_to(cache.parent.parent)
            self._dvc = (cache, remote)
        return self._dvc

    def _object(self, md5: str) -> Path | None:
        """Where a DVC object is stored (cache first, then the local remote), or None."""
        for folder in self._dvc_dirs():
            if folder is not None and (folder / md5[:2] / md5[2:]).is_file():
                return folder / md5[:2] / md5[2:]
        return None

    def dvc(self, kind: str, folder: str, md5: str, capability: str | None = None) -> dict[str, Any]:
        return self.once(f"dvc:{kind}:{md5}:{capability}",
                         lambda: self._dvc_node(kind, folder, md5, capability))

    def _dvc_node(self, kind: str, folder: str, md5: str, capability: str | None,
                  children: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if not md5:
            return _node(kind, folder, False, f"no {kind} recorded", children)
        cache, _remote = self._dvc_dirs()
        if cache is None:
            return _node(kind, md5, False, f"{self.paths.home} is not a DVC repository", children, md5=md5)
        where = self._object(md5)
        if where is None:
            return _node(kind, md5, False, f"DVC object {md5} of {folder} is in neither the cache nor the "
                         "local remote", children, md5=md5)
        if not md5.endswith(".dir"):
            return _node(kind, md5, True, f"{folder} (single file) in {where.parent.parent}", children,
                         md5=md5)
        try:
            entries = json.loads(where.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return _node(kind, md5, False, f"DVC manifest {where} unreadable: {exc}", children, md5=md5)
        if capability:
            prefix = f"{capability}/"
            entries = [e for e in entries if str(e.get("relpath", "")).startswith(prefix)]
        missing = [e["relpath"] for e in entries if self._object(str(e.get("md5", ""))) is None]
        scope = f"{folder}/{capability}" if capability else folder
        if capability and not entries:
            return _node(kind, md5, False, f"{folder} version {md5} has no files for '{capability}'",
                         children, md5=md5, files=[])
        ok = not missing
        detail = (f"{scope}: {len(entries)} files, manifest and objects stored" if ok else
                  f"{scope}: {len(missing)} of {len(entries)} file objects missing from cache and remote "
                  f"(first: {missing[0]})")
        files = [{"path": e["relpath"], "md5": e.get("md5")} for e in entries[:_MAX_LISTED_FILES]]
        return _node(kind, md5, ok, detail, children, md5=md5, files=files, n_files=len(entries),
                     missing=missing[:_MAX_LISTED_FILES])

    # -- curated data and the ingest runs behind it ------------------------------------------------------
    def data_version(self, md5: str) -> dict[str, Any]:
        return self.once(f"data:{md5}", lambda: self._dvc_node("data_version", "data/curated", md5, None,
                                                               self._ingest_runs(md5) if md5 else []))

    def _ingest_runs(self, md5: str) -> list[dict[str, Any]]:

        experiment = self.client.get_experiment_by_name(registry.experiment_name("ingest"))
        if experiment is None:
            return [_node("run", "ingest runs", False, "no traceops/ingest experiment in the MLflow store")]
        runs = self.client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'",
                                       order_by=["attributes.start_time ASC"], max_results=5000)
        producing = [r for r in runs if r.data.tags.get(TAG_DATA_VERSION) == md5]
        if not producing:
            return [_node("run", "ingest runs", False, f"no finished ingest run recorded data version {md5}")]
        last = max(r.info.start_time for r in producing)
        behind = [r for r in runs if r.info.start_time <= last and r.data.tags.get(TAG_DATA_VERSION)]
        return [self._ingest_run(r, md5) for r in behind]

    def _ingest_run(self, run: Any, md5: str) -> dict[str, Any]:
        import mlflow


        run_id = run.info.run_id
        version = run.data.tags.get(TAG_DATA_VERSION, "")
        role = "wrote this version" if version == md5 else f"earlier version {version}"
        try:
            text = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=RAW_FILES_ARTIFACT, dst_path=str(self._tmp() / run_id),
                tracking_uri=self.paths.mlflow_uri)
            entries = json.loads(Path(text).read_text())
        except Exception:  # no artifact: a run from before raw-file manifests were recorded
            return _node("run", f"ingest run {run_id}", True, f"{role}; no {RAW_FILES_ARTIFACT} "
                         "recorded (run predates raw-file manifests)", warning=True, run_id=run_id)
        recorded = run.data.tags.get(TAG_RAW_FILES)
        if recorded and recorded != manifest_hash(entries):
            return _node("run", f"ingest run {run_id}", False, f"{RAW_FILES_ARTIFACT} does not "
                         f"match its recorded hash {recorded[:12]}: the manifest was altered", run_id=run_id)
        files = []
        for entry in entries:
            key = (str(entry.get("path")), str(entry.get("sha256")))
            if key not in self.raw_seen:  # re-ingested files are listed under the first run only
                self.raw_seen.add(key)
                files.append(self._raw_file(entry))
        return _node("run", f"ingest run {run_id}", True,
                     f"{role}; {len(entries)} input files ({len(files)} listed here)", files, run_id=run_id)

    def _raw_file(self, entry: dict[str, Any]) -> dict[str, Any]:
        path = Path(str(entry.get("path", "")))
        full = path if path.is_absolute() else self.paths.home / path
        sha = str(entry.get("sha256", ""))
        common = {"path": str(path), "sha256": sha, "size": entry.get("size")}
        if not full.is_file():
            return _node("raw_file", str(path), False, f"missing ({RAW_WARNING})", warning=True,
                         status="missing", **common)
        if full.stat().st_size != entry.get("size") or file_hash(full) != sha:
            return _node("raw_file", str(path), False, f"changed since ingest ({RAW_WARNING})", warning=True,
                         status="changed", **common)
        return _node("raw_file", str(path), True, f"sha256 {sha[:12]} matches", status="ok", **common)

    def _tmp(self) -> Path:
        import tempfile

        if not hasattr(self, "_tmpdir"):
            self._tmpdir = tempfile.TemporaryDirectory(prefix="traceops-lineage-")
        return Path(self._tmpdir.name)

    def close(self) -> None:
        if hasattr(self, "_tmpdir"):
            self._tmpdir.cleanup()


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node["children"]:
        out += _walk(child)
    return out


def lineage(paths: Paths, model_uri: str) -> dict[str, Any]:
    """The verified lineage tree of ``model_uri`` (``name@alias``, ``name/version``, optionally
    ``models:/``-prefixed). Returns ``{"model", "version", "ok", "broken", "warnings", "tree"}``;
    raises LineageError naming what exists when the reference does not resolve."""

    registry.configure(paths)
    try:
        ref = registry.resolve_ref(model_uri)
    except ConfigError as exc:
        raise LineageError(f"cannot audit {model_uri}: {exc}") from exc
    audit = _Audit(paths)
    try:
        tree = audit.version(ref.name, ref.version)
    finally:
        audit.close()
    nodes = [n for n in _walk(tree) if not n.get("ref")]
    def line(n: dict[str, Any]) -> str:
        return f"{n['kind']} {n['name']}: {n['detail']}"

    broken = [line(n) for n in nodes if not n["ok"] and not n.get("warning")]
    warnings = [line(n) for n in nodes if n.get("warning")]
    return {"model": model_uri, "version": ref.as_dict(), "ok": not broken, "broken": broken,
            "warnings": warnings, "tree": tree}


def render_tree(result: dict[str, Any]) -> str:
    """The lineage as indented text: one line per link, ``✓`` verified, ``✗`` broken, ``!`` warning."""
    status = "all links verified" if result["ok"] else f"{len(result['broken'])} broken link(s)"
    if result["warnings"]:
        status += f", {len(result['warnings'])} warning(s)"
    version = result["version"]
    lines = [f"{result['model']} -> {version['name']}/{version['version']}: {status}"]

    def mark(node: dict[str, Any]) -> str:
        return "✓" if node["ok"] else "!" if node.get("warning") else "✗"

    def add(node: dict[str, Any], prefix: str, last: bool) -> None:
        branch = "└── " if last else "├── "
        lines.append(f"{prefix}{branch}{mark(node)} {node['kind']} {node['name']}: {node['detail']}")
        children = node["children"]
        for i, child in enumerate(children):
            add(child, prefix + ("    " if last else "│   "), i == len(children) - 1)

    add(result["tree"], "", True)
    return "\n".join(lines)
