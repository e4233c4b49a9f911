"""The HTTP API face of ``approvald serve``: ``/v1`` routes (:mod:`bot.api.routes`), decision
webhooks (:mod:`bot.api.webhooks`) and the ``approvald tokens`` commands
(:mod:`bot.api.cli`). Its runtime half is :mod:`runtime.external`."""
