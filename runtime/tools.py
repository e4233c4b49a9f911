"""Tool definitions: the ``@tool`` decorator, argument schemas, permissions and policies.

Arguments come from the function's type hints (or one pydantic model parameter); the
JSON schema handed to the model is derived from them and the same schema validates
arguments the model proposes and arguments an approver edits.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_type_hints, overload

from approvald.runtime.clock import Clock
from approvald.runtime.errors import ConfigError, InvalidArguments
from approvald.runtime.policy import ApprovalPolicy, PolicyKind
from approvald.runtime.sensitive import normalize_path
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

    def json_schema(self) -> dict[str, Any]:
        """JSON schema of the arguments, as handed to the model."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return schema

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
    model: type[BaseModel] = create_model(
        f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
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
    """

    def wrap(f: ToolFn) -> Tool:
        return Tool(
            f, name=name, description=description, permission=permission, policy=policy,
            approval=approval, idempotent=idempotent, reconcile=reconcile, impact=impact,
            timeout=timeout, sensitive=sensitive,
        )

    return wrap(fn) if fn is not None else wrap
