"""The tree of a query, read from the engine's ``EXPLAIN AST`` text (``guard.py`` vets it).

One node a line, indented by depth, with its declared child count. A quoted alias may
hold a line break and so print lines of its own; the declared counts are checked, so a
tree that does not read back exactly is refused (``unreadable``) rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from aggregator.sink.errors import QueryRefused

_LINE: Final = re.compile(r"(?P<indent> *)(?P<kind>[A-Za-z][A-Za-z ]*?)(?: (?P<rest>.*?))?")
_CHILDREN: Final = re.compile(r" ?\(children (\d+)\)$")
_ALIAS: Final = re.compile(r" \(alias [^)]*\)$")


@dataclass
class Node:
    """One node of an EXPLAIN AST tree."""

    kind: str
    name: str
    declared: int
    children: list[Node] = field(default_factory=list)


def parse_tree(lines: list[str]) -> Node:
    """The tree of EXPLAIN AST's text lines; QueryRefused when it does not read back exactly."""
    stack: list[tuple[int, Node]] = []
    root: Node | None = None
    for line in lines:
        text = line.rstrip("\n")
        declared = 0
        counted = _CHILDREN.search(text)
        if counted:
            declared = int(counted.group(1))
            text = text[: counted.start()]
        text = _ALIAS.sub("", text)
        match = _LINE.fullmatch(text)
        if match is None:
            raise unreadable()
        depth = len(match.group("indent"))
        node = Node(match.group("kind").strip(), (match.group("rest") or "").strip(), declared)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if not stack:
            if root is not None or depth != 0:
                raise unreadable()
            root = node
        elif depth != stack[-1][0] + 1:
            raise unreadable()
        else:
            stack[-1][1].children.append(node)
        stack.append((depth, node))
    if root is None:
        raise unreadable()
    _check_counts(root)
    return root


def _check_counts(node: Node) -> None:
    if len(node.children) != node.declared:
        raise unreadable()
    for child in node.children:
        _check_counts(child)


def unreadable() -> QueryRefused:
    """The refusal of a query whose tree does not read back exactly."""
    return QueryRefused(
        "the query's syntax tree does not read back exactly (a quoted name with a line "
        "break?): refused",
        reason="unreadable",
    )
