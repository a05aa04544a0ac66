"""Package layout: the library ``traceops`` plus the top-level ``tasks/`` and ``flows/`` folders installed as
``traceops.tasks`` and ``traceops.flows``, so the wheel adds no generic top-level names (metadata lives in
pyproject.toml)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["traceops", "traceops.*"]), "traceops.tasks", "traceops.flows"],
    package_dir={"traceops.tasks": "tasks", "traceops.flows": "flows"},
)
