"""What the page sends of a surface's inputs, checked and turned into Slack's state.

When a person presses a button or submits a modal, Slack sends the state of the surface's
inputs with it (``state.values`` of a message, ``view.state.values`` of a view): the text
typed, the option chosen in a ``static_select`` or ``radio_buttons``, the options ticked in
``checkboxes``. The page sends the same as ``{block_id: {action_id: value}}`` (text, an
option's value, a list of option values); :func:`surface_state` takes only inputs the
surface really has and options they really offer, and answers the option objects Slack
would send.
"""

from __future__ import annotations

from typing import Any

from approvald.bot.sandbox.state import JSON

CHOICE = ("static_select", "radio_buttons")
FILLABLE = ("plain_text_input", *CHOICE, "checkboxes")


class BadInput(Exception):
    """A request the page should never send: 400 with this message, nothing changed."""


def inputs_of(blocks: Any) -> dict[tuple[str, str], JSON]:
    """Every fillable element of ``blocks``, by (block_id, action_id)."""
    found: dict[tuple[str, str], JSON] = {}
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict):
            continue
        elements = [block.get("accessory"), block.get("element"),
                    *(block.get("elements") or [] if block.get("type") == "actions" else [])]
        for el in elements:
            if isinstance(el, dict) and el.get("type") in FILLABLE:
                found[(str(block.get("block_id")), str(el.get("action_id")))] = el
    return found


def element_state(el: JSON, given: Any, where: str) -> Any:
    """The state Slack sends for ``el`` holding ``given``: text stays text (a
    ``plain_text_input``), a choice becomes its option object(s)."""
    kind = el.get("type")
    if kind == "plain_text_input":
        if not isinstance(given, str):
            raise BadInput(f"{where} must be text")
        limit = el.get("max_length")
        if isinstance(limit, int) and len(given) > limit:
            raise BadInput(f"{where} is longer than {limit} characters")
        return given
    options = {o.get("value"): o for o in el.get("options") or [] if isinstance(o, dict)}
    if kind in CHOICE:
        if not isinstance(given, str) or given not in options:
            raise BadInput(f"{where}: not one of its options")
        return {"type": kind, "selected_option": options[given]}
    if not isinstance(given, list) or len(set(map(str, given))) != len(given) \
            or not all(isinstance(v, str) and v in options for v in given):
        raise BadInput(f"{where}: not a list of its options")
    return {"type": kind,
            "selected_options": [o for value, o in options.items() if value in given]}


def surface_state(blocks: Any, given: Any) -> dict[str, dict[str, Any]]:
    """``given`` (the page's ``{block_id: {action_id: value}}``) checked against the
    inputs of ``blocks``, as the state :meth:`SlackClientSim.click` and
    :meth:`~SlackClientSim.submit_view` send."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise BadInput("values must be an object")
    inputs = inputs_of(blocks)
    state: dict[str, dict[str, Any]] = {}
    for block_id, actions in given.items():
        if not isinstance(actions, dict):
            raise BadInput("values must map block ids to {action id: value}")
        for action_id, value in actions.items():
            el = inputs.get((block_id, action_id))
            if el is None:
                raise BadInput(f"there is no input {block_id}/{action_id} here")
            state.setdefault(block_id, {})[action_id] = element_state(
                el, value, f"{block_id}/{action_id}")
    return state
