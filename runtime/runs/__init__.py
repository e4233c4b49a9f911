"""The runs that make and resume gated calls: agents, the runner, the worker, callers' external
calls."""
