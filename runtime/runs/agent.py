"""Agent definitions and the registry the CLI and workers look agents up in."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from approvald.runtime.kernel.canonical import canonical_json, sha256_hex
from approvald.runtime.kernel.errors import ConfigError, InvalidArguments, NotFound
from approvald.runtime.models.base import Model, ToolSpec
from approvald.runtime.policies.policy import Channel, PolicyFile, is_namespaced, is_pattern
from approvald.runtime.policies.tools import Tool, ToolIdentity
from approvald.store.records import RunRecord


@dataclass
class Agent:
    """An agent: a name, its instructions, a model and the tools it may call."""

    name: str
    instructions: str
    model: Model
    tools: Sequence[Tool]
    max_steps: int = 50
    # shared by every process through the database: at most this many runs of the agent
    # advance at once, and at most this many model calls start per minute (None: no limit)
    max_concurrent_runs: int | None = None
    model_calls_per_minute: int | None = None
    # the release of this agent that a run records when it starts (default: a digest of
    # the instructions and the tools' names and schemas); a process may register the
    # previous release beside the current one, ``retired``, to finish the runs started on it
    version: str = ""
    retired: bool = False
    _by_name: dict[str, Tool] = field(init=False, repr=False)
    _specs: list[ToolSpec] | None = field(default=None, init=False, repr=False)
    # (the instructions it was worked out for, the digest): a run's every step asks
    _digest: tuple[str, str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for knob in ("max_concurrent_runs", "model_calls_per_minute"):
            value = getattr(self, knob)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"agent {self.name!r}: {knob} must be a positive integer")
        self._by_name = {}
        for t in self.tools:
            if t.name in self._by_name:
                raise ConfigError(f"agent {self.name!r} defines tool {t.name!r} twice")
            self._by_name[t.name] = t
        if not isinstance(self.version, str) or len(self.version) > 64 \
                or (self.version and not self.version.isprintable()):
            raise ConfigError(f"agent {self.name!r}: version must be a printable string of at "
                              "most 64 characters")
        if not self.version:
            self.version = self.instructions_version

    def tool(self, name: str) -> Tool | None:
        return self._by_name.get(name)

    def tool_specs(self) -> list[ToolSpec]:
        """What the model is told about the tools (computed once: schemas do not change)."""
        if self._specs is None:
            self._specs = [ToolSpec(t.name, t.description, t.json_schema()) for t in self.tools]
        return self._specs

    def cannot_run(self, tool: str, args: dict[str, Any],
                   asked: ToolIdentity | None = None) -> str | None:
        """Why this release could not run an approved call of ``tool`` with exactly
        ``args`` (the tool is gone, its schema no longer accepts them, or it is no longer
        the tool the call was asked about, ``asked``: another version, not declared
        compatible); None if it can."""
        found = self.tool(tool)
        why: str | None = None
        if found is None:
            why = "no such tool"
        else:
            try:
                found.validate(args)
            except InvalidArguments as exc:
                why = f"the approved arguments no longer fit its schema ({exc})"
            else:
                why = found.changed_since(asked)
        if why is None:
            return None
        return f"approved call `{tool}` cannot run on agent {self.name} v{self.version}: {why}"

    @property
    def instructions_version(self) -> str:
        """A short digest of the instructions and tool schemas, recorded with each run.
        Worked out once per instructions text (the tool schemas are read once, as
        :meth:`tool_specs` says), not at each step that compares it (issue 50)."""
        known = self._digest
        if known is not None and known[0] is self.instructions:
            return known[1]
        doc = {
            "instructions": self.instructions,
            "tools": [
                {"name": s.name, "description": s.description, "parameters": s.parameters}
                for s in self.tool_specs()
            ],
        }
        digest = sha256_hex(canonical_json(doc))[:16]
        self._digest = (self.instructions, digest)
        return digest


class Registry:
    """Agents by name, with the deployment's policy file applied to their tools."""

    def __init__(self, agents: Iterable[Agent] = (), policy: PolicyFile | None = None) -> None:
        self._agents: dict[str, Agent] = {}  # the current release of each agent
        self._versions: dict[tuple[str, str], Agent] = {}  # every release, current or retired
        self._policy = policy or PolicyFile()
        for a in agents:
            self.add(a)

    @property
    def policy(self) -> PolicyFile:
        """The policy file in force (every part reads it through here)."""
        return self._policy

    def use_policy(self, policy: PolicyFile) -> None:
        """Put ``policy`` in force for requests not yet made (the stored request decides
        the others): what a process that reloads its policy file does."""
        self._policy = policy

    def add(self, agent: Agent) -> None:
        """Register an agent. Several releases of one agent may be registered: exactly one
        current, the others ``retired`` (they only finish the runs started on them)."""
        key = (agent.name, agent.version)
        if key in self._versions:
            raise ConfigError(f"two agents are named {agent.name!r} (both version "
                              f"{agent.version!r})")
        current = self._agents.get(agent.name)
        if current is not None and not agent.retired:
            raise ConfigError(
                f"two agents are named {agent.name!r} (versions {current.version!r} and "
                f"{agent.version!r}): mark all but the current one retired=True")
        for t in agent.tools:  # fail at start-up, not at the first gated call
            found = self.policy.entry(t.name)
            # rules see the validated dump: exactly the declared fields (closed)
            schema = t.rule_schema() if found is not None and found[1].rules else None
            self.policy.check(t.name, t.policy, t.approval, schema, closed=True)
        self._versions[key] = agent
        if not agent.retired:
            self._agents[agent.name] = agent

    def get(self, name: str) -> Agent:
        """The current release of the agent ``name`` (what a new run starts on)."""
        try:
            return self._agents[name]
        except KeyError:
            retired = sorted(v for (n, v) in self._versions if n == name)
            if retired:
                raise NotFound(f"agent {name!r} is retired (versions {', '.join(retired)} "
                               "only finish the runs started on them)") from None
            known = ", ".join(sorted(self._agents)) or "none"
            raise NotFound(f"unknown agent {name!r} (known: {known})") from None

    def version(self, name: str, version: str) -> Agent | None:
        """The release ``version`` of agent ``name``, if this process registers it."""
        return self._versions.get((name, version))

    def for_run(self, run: RunRecord) -> Agent:
        """The release a run goes on with: the one it started on while it is registered,
        else the current one (whose tools the runner checks each approved call against)."""
        found = self._versions.get((run.agent, run_version(run)))
        return found if found is not None else self.get(run.agent)

    def sensitive_paths(self, run: RunRecord, tool: str) -> tuple[str, ...]:
        """The argument paths ``run``'s ``tool`` masks: the tool's own and what the policy
        file adds (() for a tool this process does not know)."""
        try:
            t = self.for_run(run).tool(tool)
        except NotFound:
            return ()
        if t is None:
            return ()
        return tuple(self.policy.effective(tool, t.policy, t.approval)[1].sensitive)

    def releases(self) -> list[Agent]:
        """Every registered release, current and retired."""
        return list(self._versions.values())

    def names(self) -> list[str]:
        return sorted(self._agents)

    async def aclose(self) -> None:
        """Close model clients that hold connections (those with an ``aclose`` method)."""
        closed: set[int] = set()
        for agent in self._versions.values():
            close = getattr(agent.model, "aclose", None)
            if close is not None and id(agent.model) not in closed:
                closed.add(id(agent.model))
                await close()

    def naming_channel(self, channel: Channel) -> str | None:
        """Where a policy in force (the file's, or an agent's code for its own tools) names
        ``channel`` (:meth:`PolicyFile.naming`); None when none does."""
        return self.policy.naming(channel, [(t.name, t.policy, t.approval)
                                            for a in self._versions.values()
                                            for t in a.tools])

    def check_policy(self) -> None:
        """Refuse a policy file that names a tool no agent defines (likely a typo). Entries
        for other sources' tools (``api:TOKEN/TOOL``, ``mcp:GATEWAY/TOOL``,
        ``adapter:NAME/TOOL``) and globs need no agent; they are checked over the file's
        ``[default]``, as they will be applied."""
        defined = {t.name for a in self._versions.values() for t in a.tools}
        kind, base = self.policy.default_policy()
        for name in self.policy.tools:
            if name in defined:
                continue
            if not is_namespaced(name) and not is_pattern(name):
                raise ConfigError(
                    f"APPROVALD_POLICY_FILE: {self.policy.source or 'policy'}: "
                    f"tools.{name}: no agent defines a tool named {name!r} (a tool of an "
                    f'HTTP API token is named "api:TOKEN/{name}", of an MCP gateway '
                    f'"mcp:GATEWAY/{name}", of an adapter "adapter:NAME/{name}")'
                )
            self.policy.check(name, kind, base)  # as for agents' tools: fail at start-up

    def load_modules(self, spec: str) -> None:
        """Import ``APPROVALD_AGENTS`` modules (comma-separated) and add their agents.

        A module contributes every module-level :class:`Agent`, or, if it defines
        ``AGENTS``, exactly that list.
        """
        for modname in (s.strip() for s in spec.split(",")):
            if not modname:
                continue
            try:
                module = importlib.import_module(modname)
            except ImportError as exc:
                raise ConfigError(f"APPROVALD_AGENTS: cannot import {modname!r}: {exc}") from None
            found = getattr(module, "AGENTS", None)
            if found is None:
                found = [v for v in vars(module).values() if isinstance(v, Agent)]
            if not found:
                raise ConfigError(f"APPROVALD_AGENTS: module {modname!r} defines no Agent")
            for a in found:
                self.add(a)


def definition_changed(run: RunRecord, agent: Agent) -> str:
    """What a run hears when the agent it goes on with is not defined as when it started:
    the digest recorded with each run (``instructions_version``) covers the instructions
    and the tools' names, descriptions and schemas, so it says which release each side is
    and that one of those changed, never that the instructions did when only a tool did."""
    def release(version: str | None, digest: str) -> str:
        return (f"v{version} (definition {digest})" if version and version != digest
                else f"definition {digest}")

    return (f"run {run.id} of agent {agent.name} started on "
            f"{release(run.agent_version, run.instructions_version)} and goes on with "
            f"{release(agent.version, agent.instructions_version)}: the agent's instructions "
            "or its tools' names, descriptions or schemas changed since")


def run_version(run: RunRecord) -> str:
    """The agent release a run started on (runs from before releases were recorded: the
    digest of the instructions they started with, which was the release's default)."""
    return run.agent_version or run.instructions_version
