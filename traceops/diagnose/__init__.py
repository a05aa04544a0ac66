"""Diagnosis: detectors, capability labelers, contrastive selection, clustering, attribution, report.

The public entry points are ``traceops.diagnose.run.diagnose`` (pure) and
``traceops.diagnose.outputs.write_outputs`` (files).
"""
