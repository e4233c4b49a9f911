"""Block Kit checks: the limits Slack enforces with ``invalid_blocks``.

Only the limits an approval card can realistically hit are checked (block count, text
lengths, button values, ids), so a message the emulator accepts is one Slack would accept
too for the shapes approvald builds. Error messages imitate Slack's
``response_metadata.messages`` entries ("[ERROR] ... [json-pointer:/blocks/3/...]").
"""

from __future__ import annotations

from typing import Any

MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_ID = 255
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000
MAX_ACTIONS_ELEMENTS = 25
MAX_OPTIONS = 10  # a checkboxes or radio_buttons element's options
MAX_SELECT_OPTIONS = 100  # a static_select's
MAX_OPTION_TEXT = 75  # an option's text and description
MAX_OPTION_VALUE = 150


def block_problems(blocks: Any, *, max_blocks: int = MAX_MESSAGE_BLOCKS) -> list[str]:
    """Return Slack-style error lines for ``blocks``; an empty list means they are valid."""
    if not isinstance(blocks, list):
        return ["[ERROR] must provide an array [json-pointer:/blocks]"]
    problems: list[str] = []
    if len(blocks) > max_blocks:
        problems.append(f"[ERROR] no more than {max_blocks} items allowed [json-pointer:/blocks]")
    seen_ids: set[str] = set()
    for i, block in enumerate(blocks):
        where = f"/blocks/{i}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            problems.append(f"[ERROR] missing required field: type [json-pointer:{where}]")
            continue
        block_id = block.get("block_id")
        if isinstance(block_id, str):
            if len(block_id) > MAX_ID:
                problems.append(_too_long(MAX_ID, f"{where}/block_id"))
            if block_id in seen_ids:
                # Slack rejects duplicate block ids: state values are keyed by them.
                problems.append(f"[ERROR] duplicate block_id {block_id!r} [json-pointer:{where}]")
            seen_ids.add(block_id)
        problems += _block_text_problems(block, where)
        for j, element in enumerate(_elements(block)):
            problems += _element_problems(element, f"{where}/elements/{j}")
        for key in ("accessory", "element"):  # a section's accessory, an input's element
            if isinstance(block.get(key), dict):
                problems += _element_problems(block[key], f"{where}/{key}")
    return problems


def _block_text_problems(block: dict[str, Any], where: str) -> list[str]:
    kind = block["type"]
    text = _text_of(block.get("text"))
    if kind == "section" and text is not None and len(text) > MAX_SECTION_TEXT:
        return [_too_long(MAX_SECTION_TEXT, f"{where}/text")]
    if kind == "header" and text is not None and len(text) > MAX_HEADER_TEXT:
        return [_too_long(MAX_HEADER_TEXT, f"{where}/text")]
    if kind == "actions":
        elements = block.get("elements")
        if isinstance(elements, list) and len(elements) > MAX_ACTIONS_ELEMENTS:
            return [f"[ERROR] no more than {MAX_ACTIONS_ELEMENTS} items allowed "
                    f"[json-pointer:{where}/elements]"]
    return []


def _element_problems(element: Any, where: str) -> list[str]:
    if not isinstance(element, dict):
        return []
    problems: list[str] = []
    action_id = element.get("action_id")
    if isinstance(action_id, str) and len(action_id) > MAX_ID:
        problems.append(_too_long(MAX_ID, f"{where}/action_id"))
    if element.get("type") == "button":
        label = _text_of(element.get("text"))
        if label is not None and len(label) > MAX_BUTTON_TEXT:
            problems.append(_too_long(MAX_BUTTON_TEXT, f"{where}/text"))
        value = element.get("value")
        if isinstance(value, str) and len(value) > MAX_BUTTON_VALUE:
            problems.append(_too_long(MAX_BUTTON_VALUE, f"{where}/value"))
    if element.get("type") in ("checkboxes", "radio_buttons"):
        problems += _options_problems(element, where)
    if element.get("type") == "static_select" and "option_groups" not in element:
        problems += _options_problems(element, where, most=MAX_SELECT_OPTIONS)
    return problems


def _options_problems(element: dict[str, Any], where: str, *,
                      most: int = MAX_OPTIONS) -> list[str]:
    options = element.get("options")
    if not isinstance(options, list):
        return [f"[ERROR] missing required field: options [json-pointer:{where}/options]"]
    problems: list[str] = []
    if not 0 < len(options) <= most:
        problems.append(f"[ERROR] must provide between 1 and {most} items "
                        f"[json-pointer:{where}/options]")
    for k, option in enumerate(options):
        at = f"{where}/options/{k}"
        if not isinstance(option, dict):
            continue
        for key in ("text", "description"):
            text = _text_of(option.get(key))
            if text is not None and len(text) > MAX_OPTION_TEXT:
                problems.append(_too_long(MAX_OPTION_TEXT, f"{at}/{key}"))
        value = option.get("value")
        if isinstance(value, str) and len(value) > MAX_OPTION_VALUE:
            problems.append(_too_long(MAX_OPTION_VALUE, f"{at}/value"))
    return problems


def _elements(block: dict[str, Any]) -> list[Any]:
    # Only actions blocks hold interactive elements in "elements"; context blocks hold text.
    if block["type"] != "actions":
        return []
    elements = block.get("elements")
    return elements if isinstance(elements, list) else []


def _text_of(obj: Any) -> str | None:
    if isinstance(obj, dict) and isinstance(obj.get("text"), str):
        text: str = obj["text"]
        return text
    return None


def _too_long(limit: int, pointer: str) -> str:
    return f"[ERROR] must be less than {limit + 1} characters [json-pointer:{pointer}]"


def find_element(blocks: Any, action_id: str) -> tuple[str | None, dict[str, Any] | None]:
    """Locate the interactive element with ``action_id``: (its block_id, the element)."""
    if not isinstance(blocks, list):
        return None, None
    for block in blocks:
        if not isinstance(block, dict):
            continue
        candidates = list(block.get("elements") or []) if block.get("type") == "actions" else []
        if isinstance(block.get("accessory"), dict):
            candidates.append(block["accessory"])
        if isinstance(block.get("element"), dict):  # input blocks
            candidates.append(block["element"])
        for element in candidates:
            if isinstance(element, dict) and element.get("action_id") == action_id:
                return block.get("block_id"), element
    return None, None
