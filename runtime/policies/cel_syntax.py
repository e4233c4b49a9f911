"""A parser for Common Expression Language conditions, for checking them before they run.

The ``cel`` package compiles and evaluates conditions but exposes no syntax tree, and a
checker needs one: which fields a condition selects, which operands an operator gets.
This follows the grammar of the CEL specification (``CEL.g4``: precedence, literals,
macros as calls). It only ever reads text that ``cel.compile`` has already accepted;
text it cannot read raises :class:`SyntaxUnknown`, and a checker then checks nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class SyntaxUnknown(Exception):
    """Text this parser does not read (the evaluator's parser is the authority)."""


@dataclass(frozen=True)
class Node:
    """A syntax node; ``start``/``end`` index the source text, to quote it."""

    start: int
    end: int


@dataclass(frozen=True)
class Literal(Node):
    kind: str  # int, uint, double, string, bytes, bool, null
    text: str  # as written: a probe evaluates the literal itself
    value: object = None  # a string's value when it has no escapes, else None


@dataclass(frozen=True)
class Ident(Node):
    name: str


@dataclass(frozen=True)
class Select(Node):
    operand: Node
    field: str
    test_only: bool = False  # has(operand.field)


@dataclass(frozen=True)
class Index(Node):
    operand: Node
    index: Node


@dataclass(frozen=True)
class Call(Node):
    function: str
    target: Node | None  # the receiver of a method call
    args: tuple[Node, ...]


@dataclass(frozen=True)
class Unary(Node):
    op: str  # "!" or "-"
    operand: Node


@dataclass(frozen=True)
class Binary(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Conditional(Node):
    condition: Node
    then: Node
    otherwise: Node


@dataclass(frozen=True)
class ListExpr(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class MapExpr(Node):
    entries: tuple[tuple[Node, Node], ...]


@dataclass(frozen=True)
class Opaque(Node):
    """A construct whose type the checker does not follow (a message literal, ``.?``)."""

    parts: tuple[Node, ...] = field(default=())


_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>(?:[bB]?[rR]|[rR][bB])(?:'''.*?'''|\"\"\".*?\"\"\"|'[^'\n]*'|"[^"\n]*")
              |[bB]?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
                    |'(?:\\.|[^\\'\n])*'|"(?:\\.|[^\\"\n])*"))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?
               |(?:\d+\.\d+|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+[uU]?)
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])
""", re.VERBOSE | re.DOTALL)

_RELATIONS = ("<", "<=", ">=", ">", "==", "!=", "in")


@dataclass(frozen=True)
class _Token:
    kind: str  # string, number, ident, op, end
    text: str
    start: int
    end: int


def _tokens(text: str) -> list[_Token]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SyntaxUnknown(f"at {pos}")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append(_Token(kind, m.group(), m.start(), m.end()))
        pos = m.end()
    out.append(_Token("end", "", len(text), len(text)))
    return out


def parse(text: str) -> Node:
    """The syntax tree of condition ``text``; :class:`SyntaxUnknown` if not read."""
    p = _Parser(_tokens(text))
    node = p.expr()
    p.expect("end")
    return node


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.t = tokens
        self.i = 0

    @property
    def peek(self) -> _Token:
        return self.t[self.i]

    def at(self, *texts: str) -> bool:
        tok = self.peek
        return tok.kind in ("op", "ident") and tok.text in texts

    def take(self) -> _Token:
        tok = self.t[self.i]
        self.i += 1
        return tok

    def expect(self, text: str) -> _Token:
        tok = self.take()
        if (tok.kind != "end") if text == "end" else tok.text != text:
            raise SyntaxUnknown(f"expected {text!r} at {tok.start}")
        return tok

    def expr(self) -> Node:
        cond = self.binary(0)
        if not self.at("?"):
            return cond
        self.take()
        then = self.binary(0)
        self.expect(":")
        otherwise = self.expr()
        return Conditional(cond.start, otherwise.end, cond, then, otherwise)

    # precedence, loosest first; each level is left-associative
    _LEVELS: tuple[tuple[str, ...], ...] = (("||",), ("&&",), _RELATIONS, ("+", "-"),
                                             ("*", "/", "%"))

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.at(*self._LEVELS[level]):
            op = self.take().text
            right = self.binary(level + 1)
            left = Binary(left.start, right.end, op, left, right)
        return left

    def unary(self) -> Node:
        if self.at("!", "-"):
            tok = self.take()
            operand = self.unary()
            if tok.text == "-" and isinstance(operand, Literal) and \
                    operand.kind in ("int", "double") and operand.start == tok.end:
                return Literal(tok.start, operand.end, operand.kind, "-" + operand.text)
            return Unary(tok.start, operand.end, tok.text, operand)
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.at("."):
                self.take()
                if self.at("?"):
                    raise SyntaxUnknown("optional field selection")
                name = self.take()
                if name.kind != "ident":
                    raise SyntaxUnknown(f"a field name at {name.start}")
                if self.at("("):
                    args, end = self.arguments()
                    node = Call(node.start, end, name.text, node, args)
                else:
                    node = Select(node.start, name.end, node, name.text)
            elif self.at("["):
                self.take()
                if self.at("?"):
                    raise SyntaxUnknown("optional index")
                index = self.expr()
                end = self.expect("]").end
                node = Index(node.start, end, node, index)
            else:
                return node

    def arguments(self) -> tuple[tuple[Node, ...], int]:
        self.expect("(")
        args: list[Node] = []
        while not self.at(")"):
            args.append(self.expr())
            if not self.at(")"):
                self.expect(",")
        return tuple(args), self.take().end

    def primary(self) -> Node:
        tok = self.peek
        if tok.kind == "number":
            self.take()
            return _number(tok)
        if tok.kind == "string":
            self.take()
            return _string(tok)
        if tok.kind == "ident":
            return self.identifier()
        if self.at("("):
            self.take()
            inner = self.expr()
            self.expect(")")
            return inner
        if self.at("["):
            start = self.take().start
            items: list[Node] = []
            while not self.at("]"):
                items.append(self.expr())
                if not self.at("]"):
                    self.expect(",")
            return ListExpr(start, self.take().end, tuple(items))
        if self.at("{"):
            start = self.take().start
            entries: list[tuple[Node, Node]] = []
            while not self.at("}"):
                key = self.expr()
                self.expect(":")
                entries.append((key, self.expr()))
                if not self.at("}"):
                    self.expect(",")
            return MapExpr(start, self.take().end, tuple(entries))
        raise SyntaxUnknown(f"unexpected {tok.text!r} at {tok.start}")

    def identifier(self) -> Node:
        tok = self.take()
        if tok.text in ("true", "false"):
            return Literal(tok.start, tok.end, "bool", tok.text, tok.text == "true")
        if tok.text == "null":
            return Literal(tok.start, tok.end, "null", tok.text)
        if self.at("("):
            args, end = self.arguments()
            if tok.text == "has" and len(args) == 1 and isinstance(args[0], Select):
                s = args[0]
                return Select(tok.start, end, s.operand, s.field, test_only=True)
            return Call(tok.start, end, tok.text, None, args)
        if self.at("{"):  # a message literal: Name{field: value}
            self.take()
            parts: list[Node] = []
            while not self.at("}"):
                self.take()
                self.expect(":")
                parts.append(self.expr())
                if not self.at("}"):
                    self.expect(",")
            return Opaque(tok.start, self.take().end, tuple(parts))
        return Ident(tok.start, tok.end, tok.text)


def _number(tok: _Token) -> Literal:
    text = tok.text
    if text[-1] in "uU":
        kind = "uint"
    elif not text.lower().startswith("0x") and any(c in text for c in ".eE"):
        kind = "double"
    else:
        kind = "int"
    return Literal(tok.start, tok.end, kind, text)


def _string(tok: _Token) -> Literal:
    text = tok.text
    prefix = text[:len(text) - len(text.lstrip("rRbB"))]
    body = text[len(prefix):]
    quote = 3 if body[:3] in ("'''", '"""') else 1
    content = body[quote:-quote]
    kind = "bytes" if "b" in prefix.lower() else "string"
    raw = "r" in prefix.lower()
    # the value only serves as a field name (args['amount_cents']): escapes are left unread
    value = content if kind == "string" and (raw or "\\" not in content) else None
    return Literal(tok.start, tok.end, kind, text, value)
