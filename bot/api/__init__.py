"""The HTTP API face of ``approvald serve``: ``/v1`` routes (:mod:`bot.api.routes`), decision
webhooks (:mod:`bot.api.webhooks`); the ``approvald tokens`` commands are in
:mod:`bot.cli.tokens`. Its runtime half is :mod:`runtime.runs.external`."""
