"""Evaluation internals: metrics (success, pass^k), held-out environment runs, domain replays of
logged failures, the per-model report and its HTML page. ``traceops.evaluate`` names the public API."""
