"""Every ``traceops.*`` tag name set on MLflow runs, logged models and registered versions.

One home for the strings so a writer and its readers (the lineage audit, stage caches, benchmarks)
cannot drift apart. Plain constants: this module imports nothing of traceops.
"""

from __future__ import annotations

# -- lineage: on every registered version (DESIGN.md, MLflow) and on the runs that produced it ------------
TAG_GIT_SHA = "traceops.git_sha"                  # commit of the code that ran
TAG_BASE_MODEL = "traceops.base_model"            # <model id>@<weights sha256>
TAG_DATA_VERSION = "traceops.data_version"        # DVC md5 of data/curated
TAG_ENV_VERSION = "traceops.env_version"          # DVC md5 of data/environments
TAG_DIAGNOSIS_RUN = "traceops.diagnosis_run"      # diagnose run behind the environments
LINEAGE_KEYS = (TAG_GIT_SHA, TAG_BASE_MODEL, TAG_DATA_VERSION, TAG_ENV_VERSION, TAG_DIAGNOSIS_RUN)

# -- registered versions and logged models ----------------------------------------------------------------
TAG_SOURCE_RUN = "traceops.source_run"            # run that registered the version
TAG_CAPABILITY = "traceops.capability"            # an adapter's capability (also on its train run)
TAG_BASE_SPEC = "traceops.base_model_spec"        # how the loading machine resolves the base model
TAG_PARENT_VERSIONS = "traceops.parent_versions"  # router/composite: JSON {model name: version}
TAG_ARTIFACT_HASH = "traceops.artifact_sha256"    # logged model: content hash of the logged folder
TAG_KIND = "traceops.kind"                        # logged model: pyfunc kind (adapter, composite)
TAG_ADAPTER_HASH = "traceops.adapter_hash"        # adapter folder content hash: registered once per hash
TAG_ROUTE_KEY = "traceops.route_key"              # route cache key: router/composite registered once per key

# -- stage runs ------------------------------------------------------------------------------------------
TAG_STAGE = "traceops.stage"                      # the stage a run belongs to
TAG_RAW_FILES = "traceops.raw_files_sha256"       # ingest: hash of the raw-files manifest artifact
TAG_TRAIN_KEY = "traceops.train_key"              # train: the task's cache key (finds abandoned attempts)
TAG_ROLE = "traceops.role"                        # train: adapter or generic
TAG_REGISTERED_VERSION = "traceops.registered_version"  # train: the adapter version it registered
TAG_REHEARSAL = "traceops.rehearsal"              # train: hash of the logged successes an adapter rehearsed
TAG_REUSED_RUN = "traceops.reused_run"            # route: the run whose registered fit was reused
TAG_DECISION = "traceops.decision"                # promote: the alias the candidate got
TAG_CANDIDATE = "traceops.candidate"              # promote: <model name>/<version> decided on
TAG_PROMOTED = "traceops.promoted"                # nightly: whether the night promoted (true/false)
TAG_DEFERRED = "traceops.deferred"                # nightly: capabilities the train plan deferred (a,b)

# -- rollback: on both versions a `traceops rollback` moved champion between (the latest such event) --------
TAG_ROLLBACK_BY = "traceops.rollback_by"          # who: TRACEOPS_USER, else the login name
TAG_ROLLBACK_REASON = "traceops.rollback_reason"  # why: the --reason text
TAG_ROLLBACK_AT = "traceops.rollback_at"          # when: UTC ISO time
TAG_ROLLBACK_RUN = "traceops.rollback_run"        # the MLflow run that recorded it (traceops/rollback)
TAG_ROLLED_BACK_TO = "traceops.rolled_back_to"    # on the version that lost champion: the version that got it
TAG_ROLLBACK_FROM = "traceops.rollback_from"      # on the version that got champion back: the one it replaced
