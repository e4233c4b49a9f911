"""Tool definitions: the ``@tool`` decorator, argument schemas, permissions and policies.

Arguments come from the function's type hints (or one pydantic model parameter); the
JSON schema handed to the model is derived from them and the same schema validates
arguments the model proposes and arguments an approver edits.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import types
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_type_hints, overload

from approvald.runtime.kernel.canonical import canonical_json, sha256_hex
from approvald.runtime.kernel.clock import Clock
from approvald.runtime.kernel.errors import ConfigError, InvalidArguments
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyKind
from approvald.runtime.policies.sensitive import normalize_path
from approvald.store.records import ApprovalRecord
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.errors import PydanticInvalidForJsonSchema

Permission = Literal["read", "draft", "execute"]
_DEFAULT_POLICY: dict[str, PolicyKind] = {
    "read": "auto",
    "draft": "auto",
    "execute": "approve_before",
}


@dataclass(frozen=True)
class ToolContext:
    """What a tool knows about the call it is serving.

    ``idempotency_key`` is stable across retries and restarts of the same call: pass it to
    external APIs that accept one, so the outside world deduplicates too.
    """

    run_id: str
    call_id: str
    idempotency_key: str
    requested_by: str
    agent: str
    clock: Clock
    attempt: int = 1


@dataclass(frozen=True)
class Reconciled:
    """A reconcile hook's verdict on a call whose outcome is unknown.

    ``happened=True`` with ``result`` records the call as done; ``happened=False`` lets the
    runtime run it again under the same idempotency key.
    """

    happened: bool
    result: Any = None


@dataclass(frozen=True)
class ToolIdentity:
    """What an approval binds besides the tool's name and the arguments: the tool's
    ``version`` (declared, or a digest of its code) and a digest of its argument schema.
    A call is run only by a tool of the same identity, or by one whose release declares
    the approved version compatible (:meth:`Tool.changed_since`)."""

    version: str
    schema: str

    def digest(self) -> str:
        """One digest of the whole identity: what the audit log records when it names an
        identity (exported as its binding, ``runtime/kernel/binding.py``, never as it is)."""
        return sha256_hex(f"{self.version}\0{self.schema}")


# the identity of a tool its runner no longer offers (an MCP server that stopped listing
# it): equal to no identity a request records (a version is never empty)
GONE = ToolIdentity("", "")


def identity_change(asked: ToolIdentity | None, now: ToolIdentity | None) -> str | None:
    """What changed between the identity a call was asked about under (``asked``) and the
    one of the tool that would run it ``now``, for a tool whose releases declare nothing
    compatible (an MCP server's: its identity is its listed entry's digest). None when
    they are the same, or when either is unknown (nothing recorded, nothing said)."""
    if asked is None or now is None or asked == now:
        return None
    if now == GONE:
        return "it is no longer offered"
    if asked.schema != now.schema:
        return "its input schema is not the one approved"
    return ("its definition is not the one approved (the same input schema, but another "
            "description, output schema or annotations)")


def asked_identity(a: ApprovalRecord) -> ToolIdentity | None:
    """The identity of the tool request ``a`` was made for (None: not recorded, as for a
    caller's request or one made before identities were)."""
    if a.tool_version is None or a.tool_schema is None:
        return None
    return ToolIdentity(a.tool_version, a.tool_schema)


# What a tool's definition determines, worked out once per definition: a process that
# defines the same tools again (an agent built per request, per test: the suite's engines
# build the demo agents ~700 times) read each tool's source, made its pydantic model and
# its JSON schema each time, ~3 ms an agent of three tools. Keyed by the very objects that
# determine them (held, so no key's id is reused), bounded: once full, the oldest is let go.
_KNOWN_MAX = 512
_VERSIONS: dict[int, tuple[types.CodeType, str | None, str]] = {}
_MODELS: dict[tuple[Any, ...], tuple[tuple[Any, ...], type[BaseModel]]] = {}
_SCHEMAS: dict[int, tuple[type[BaseModel], str]] = {}


def _keep(known: dict[Any, Any], key: Any, value: Any) -> None:
    if len(known) >= _KNOWN_MAX:
        del known[next(iter(known))]  # (a dict keeps its keys in the order they came)
    known[key] = value


def code_version(fn: Callable[..., Any]) -> str:
    """A tool's default version: a digest of its code, ``code:<12 hex>``. Its source where
    Python can read it (so the same file gives the same version in every process and on
    every Python), else its compiled code (a tool defined where there is no source file,
    such as a REPL or a zipped app without sources: stable for one Python version).

    A plain function's is read once per code object (its source is found from it)."""
    plain = type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__")
    if plain:
        code, module = fn.__code__, fn.__module__
        known = _VERSIONS.get(id(code))
        if known is not None and known[0] is code and known[1] == module:
            return known[2]
    version = _code_version(fn)
    if plain:
        _keep(_VERSIONS, id(code), (code, module, version))
    return version


def _code_version(fn: Callable[..., Any]) -> str:
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = _code_text(code) if isinstance(code, types.CodeType) \
            else f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    return "code:" + sha256_hex(text)[:12]


def _code_text(code: types.CodeType) -> str:
    consts = [_code_text(c) if isinstance(c, types.CodeType) else repr(c)
              for c in code.co_consts]
    return canonical_json({"code": code.co_code.hex(), "names": list(code.co_names),
                           "vars": list(code.co_varnames), "consts": consts})


def _check_version(name: str, value: str, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 64 or not value.isprintable():
        raise ConfigError(f"tool {name!r}: {what} must be a printable string of 1-64 "
                          "characters")
    return value


ToolFn = Callable[..., Awaitable[Any]]
ReconcileFn = Callable[[ToolContext, dict[str, Any]], Awaitable[Reconciled | None]]
ImpactFn = Callable[[dict[str, Any]], str]


class Tool:
    """A callable the model may use, with its schema, permission and policy."""

    def __init__(
        self,
        fn: ToolFn,
        *,
        name: str | None = None,
        description: str | None = None,
        permission: Permission = "read",
        policy: PolicyKind | None = None,
        approval: ApprovalPolicy | None = None,
        idempotent: bool | None = None,
        reconcile: ReconcileFn | None = None,
        impact: ImpactFn | None = None,
        timeout: float | None = None,
        sensitive: Sequence[str] = (),
        version: str | None = None,
        compatible: Sequence[str] = (),
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"tool {fn.__name__!r} must be an async function")
        if permission not in _DEFAULT_POLICY:
            raise ConfigError(f"tool {fn.__name__!r}: unknown permission {permission!r}")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = (description or inspect.getdoc(fn) or self.name).strip()
        self.permission: Permission = permission
        self.policy: PolicyKind = policy or _DEFAULT_POLICY[permission]
        self.approval = approval or ApprovalPolicy()
        try:
            paths = [normalize_path(p) for p in sensitive]
        except ValueError as exc:
            raise ConfigError(f"tool {self.name!r}: sensitive: {exc}") from None
        if paths:  # carried by its policy, so every request and face knows them
            self.approval = self.approval.model_copy(update={
                "sensitive": list(dict.fromkeys([*self.approval.sensitive, *paths]))})
        # a read changes nothing, so running it twice is harmless: idempotent by default
        self.idempotent = permission == "read" if idempotent is None else idempotent
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"tool {self.name!r}: timeout must be a positive number of seconds")
        self.timeout = timeout
        self.reconcile = reconcile
        self.impact = impact
        self._wants_ctx, self._model_param, self.args_model = _build_args_model(fn, self.name)
        # its identity (what an approval binds): declared, or a digest of its code
        self.version = _check_version(self.name, version, "version") if version is not None \
            else code_version(fn)
        if isinstance(compatible, str):
            compatible = [compatible]
        self.compatible = tuple(_check_version(self.name, v, "compatible")
                                for v in compatible)
        self._identity: ToolIdentity | None = None

    def identity(self) -> ToolIdentity:
        """This tool's identity: its version and the digest of its argument schema."""
        if self._identity is None:
            self._identity = ToolIdentity(
                self.version, sha256_hex(canonical_json(self.json_schema()))[:16])
        return self._identity

    def changed_since(self, asked: ToolIdentity | None) -> str | None:
        """Why this tool is not the one a call was asked about under ``asked`` (None when
        it is, when its release declares ``asked``'s version compatible, or when nothing
        was recorded: a request from before identities were)."""
        if asked is None:
            return None
        mine = self.identity()
        if asked == mine:
            return None
        if asked.version != mine.version and asked.version in self.compatible:
            return None  # the new release says approvals of that version still hold
        if asked.version == mine.version:
            return (f"its argument schema changed under the same version {mine.version!r} "
                    f"(declare a new version, compatible=[{mine.version!r}] if approvals of "
                    "the old one may still run)")
        return (f"the tool changed since it was asked about: version {asked.version!r} was "
                f"approved, this release has {mine.version!r}, and it does not declare "
                f"{asked.version!r} compatible")

    def json_schema(self) -> dict[str, Any]:
        """JSON schema of the arguments, as handed to the model (a copy of its own: worked
        out once per argument model)."""
        model = self.args_model
        known = _SCHEMAS.get(id(model))
        if known is None or known[0] is not model:
            schema = model.model_json_schema()
            schema.pop("title", None)
            known = (model, json.dumps(schema))
            _keep(_SCHEMAS, id(model), known)
        loaded: dict[str, Any] = json.loads(known[1])
        return loaded

    def rule_schema(self) -> dict[str, Any] | None:
        """JSON schema of the arguments as rules on arguments see them: validated, then
        dumped (field names rather than aliases, values in their JSON form, only the
        declared fields); None if pydantic cannot describe them."""
        try:
            return self.args_model.model_json_schema(by_alias=False, mode="serialization")
        except PydanticInvalidForJsonSchema:
            return None

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Validate and normalize proposed arguments; raises :class:`InvalidArguments`."""
        if not isinstance(arguments, dict):
            raise InvalidArguments(
                f"arguments for {self.name} must be a JSON object",
                errors=[{"loc": [], "msg": "expected an object"}],
            )
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            errors = [
                {"loc": [str(x) for x in e["loc"]], "msg": e["msg"]} for e in exc.errors()
            ]
            first = errors[0]
            where = ".".join(first["loc"]) or "arguments"
            raise InvalidArguments(
                f"invalid arguments for {self.name}: {where}: {first['msg']}", errors=errors
            ) from None
        return model.model_dump(mode="json")

    async def invoke(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        """Run the tool with already validated arguments."""
        model = self.args_model.model_validate(arguments)
        kwargs: dict[str, Any]
        if self._model_param is not None:
            kwargs = {self._model_param: model}
        else:
            kwargs = {k: getattr(model, k) for k in type(model).model_fields}
        if self._wants_ctx:
            return await self.fn(ctx, **kwargs)
        return await self.fn(**kwargs)


def _build_args_model(fn: ToolFn, name: str) -> tuple[bool, str | None, type[BaseModel]]:
    try:
        # ToolContext is offered as a local so tools defined inside functions resolve it
        # include_extras: constraints written as Annotated[int, Field(le=5)] are kept
        hints = get_type_hints(fn, localns={"ToolContext": ToolContext}, include_extras=True)
    except NameError as exc:
        raise ConfigError(
            f"tool {name!r}: cannot resolve a type hint ({exc}); define the types it uses at "
            "module level"
        ) from None
    params = list(inspect.signature(fn).parameters.values())
    wants_ctx = bool(params) and hints.get(params[0].name) is ToolContext
    if wants_ctx:
        params = params[1:]
    if len(params) == 1:
        ann = hints.get(params[0].name)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return wants_ctx, params[0].name, ann
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"tool {name!r}: *args/**kwargs are not supported")
        if p.name not in hints:
            raise ConfigError(f"tool {name!r}: parameter {p.name!r} needs a type hint")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], default)
    # the same name and the very same types and defaults make the same model
    held = tuple(x for pair in fields.values() for x in pair)
    key = (name, *fields, *map(id, held))
    known = _MODELS.get(key)
    if known is not None and all(a is b for a, b in zip(known[0], held, strict=True)):
        return wants_ctx, None, known[1]
    model: type[BaseModel] = create_model(
        f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    _keep(_MODELS, key, (held, model))
    return wants_ctx, None, model


@overload
def tool(fn: ToolFn, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    permission: Permission = "read",
    policy: PolicyKind | None = None,
    approval: ApprovalPolicy | None = None,
    idempotent: bool | None = None,
    reconcile: ReconcileFn | None = None,
    impact: ImpactFn | None = None,
    timeout: float | None = None,
    sensitive: Sequence[str] = (),
    version: str | None = None,
    compatible: Sequence[str] = (),
) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    permission: Permission = "read",
    policy: PolicyKind | None = None,
    approval: ApprovalPolicy | None = None,
    idempotent: bool | None = None,
    reconcile: ReconcileFn | None = None,
    impact: ImpactFn | None = None,
    timeout: float | None = None,
    sensitive: Sequence[str] = (),
    version: str | None = None,
    compatible: Sequence[str] = (),
) -> Tool | Callable[[ToolFn], Tool]:
    """Declare an async function as a tool.

    ``permission`` says what the tool does (``read``, ``draft``, ``execute``); ``policy``
    says what the runtime does before running it (``auto``, ``notify_after``,
    ``approve_before``, ``forbidden``) and defaults from the permission: execute tools
    need approval. ``idempotent=True`` (the default for ``read`` tools) lets the runtime
    re-run a call whose outcome is unknown; otherwise ``reconcile`` decides, or a human is
    asked. ``timeout`` (seconds) cancels a call that runs longer, and bounds how long an
    attempt whose worker went silent may still be running. ``sensitive`` names argument
    fields whose values are secret (``"card_number"``, ``"credentials.*"``): they are
    masked wherever a person or a log sees the call; the tool receives them as they are.

    ``version`` names what the tool does (default: a digest of its code). An approval
    binds it with the tool's argument schema: a call approved for one version is not run
    by a tool of another (it becomes a ``cannot_run`` question for a person), unless the
    new release lists the approved version in ``compatible`` (``@tool(version="2",
    compatible=["1"])``: "calls approved for 1 mean the same to 2").
    """

    def wrap(f: ToolFn) -> Tool:
        return Tool(
            f, name=name, description=description, permission=permission, policy=policy,
            approval=approval, idempotent=idempotent, reconcile=reconcile, impact=impact,
            timeout=timeout, sensitive=sensitive, version=version, compatible=compatible,
        )

    return wrap(fn) if fn is not None else wrap
