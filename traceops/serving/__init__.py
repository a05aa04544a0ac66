"""What ``traceops serve`` runs behind its HTTP layer (``traceops.serve``).

- ``params``: the ``serve:`` section of params.yaml (queue size, batching window, poll interval, traffic log).
- ``requests``: checks of a request's messages, tools and prompt length, each failing with what to send.
- ``batcher``: one worker thread per loaded model that generates concurrent requests together.
- ``pool``: the models one endpoint serves (the default, its base, the champion composite, every
  registered adapter), loaded lazily, found by the request's ``model``, and swapped when an alias moves.
"""
