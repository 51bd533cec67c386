"""Reading and showing untrusted text with bounds: YAML with limits, values fit for one line.

Stack files, ESC exports and hand-edited manifests come from people and pull requests. A 1 KB
YAML alias bomb expands to gigabytes once anything walks it, deep nesting ends in a
RecursionError, and a value is printed back into terminals and CI logs. Every reader of such
text uses `load_yaml` / `load_yaml_all`, and every message that quotes a value uses `shown`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_BYTES = 4 * 1024 * 1024  # far above any stack file or rendered manifest
MAX_DEPTH = 64  # the deepest shipped stack or manifest nests ~20 levels
MAX_NODES = 200_000  # nodes after aliases are expanded (a rendered stack has a few thousand)
SHOWN_CHARS = 120  # a value quoted in a message
MESSAGE_CHARS = 2_000  # a whole message


class YAMLLimitError(yaml.MarkedYAMLError):  # type: ignore[misc]
    """YAML that is too big, too deep or expands too far to be a stack file or a manifest."""


class _BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader (no tags run) that counts depth while composing and refuses a document whose
    alias-expanded size is over MAX_NODES before anything constructs or walks it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLLimitError(
                    None,
                    None,
                    f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark,
                )
            return Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = Composer.compose_document(self)
        if node is not None:
            _check_expanded_size(node)
        return node


def _check_expanded_size(root: Node) -> None:
    """Nodes counted as a walk of the constructed value would visit them (an alias counts its
    whole target again), with memoised sizes: linear in the document, not in its expansion.
    An alias inside its own anchor (a cycle) is refused too: nothing here walks cycles."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:  # post-order without recursion
        node, done = stack.pop()
        kids = _children(node)
        if done:
            open_.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(k)] for k in kids), MAX_NODES + 1)
            continue
        if id(node) in sizes:
            continue
        open_.add(id(node))
        stack.append((node, True))
        for kid in kids:
            if id(kid) in open_:
                raise YAMLLimitError(
                    None, None, "an alias refers to its own anchor (a cycle)", kid.start_mark
                )
            if id(kid) not in sizes:
                stack.append((kid, False))
    if sizes[id(root)] > MAX_NODES:
        raise YAMLLimitError(
            None,
            None,
            f"expands to more than {MAX_NODES} nodes (YAML aliases repeated: an alias bomb?)",
            root.start_mark,
        )


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


_MARKS = re.compile(r"[\[\]{}'\"#]")
_VALUE_STARTS = frozenset("\n:[{,-?")


def _flow_depth_over(text: str, limit: int) -> bool:
    """Whether flow collections ([...], {...}) nest deeper than `limit`: checked before PyYAML,
    whose scanner looks ahead ~1,000 tokens per possible key inside deep flow nesting (seconds
    for a 1 KB line). Quoted scalars and comments are skipped; a bracket counts only where a
    value can start, so `a[0]` in a plain scalar does not."""
    depth, pos = 0, 0
    while (match := _MARKS.search(text, pos)) is not None:
        char, at = match.group(), match.start()
        pos = at + 1
        before = at - 1
        while before >= 0 and text[before] in " \t":
            before -= 1
        starts = before < 0 or text[before] in _VALUE_STARTS
        if char in "[{" and starts:
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "#" and (at == 0 or text[at - 1] in " \t\n"):
            end = text.find("\n", at)
            pos = len(text) if end < 0 else end
        elif char in "'\"" and starts:
            end = at
            while True:
                end = text.find(char, end + 1)
                if end < 0:
                    return False  # unterminated: PyYAML says so
                escaped = char == '"' and (end - len(text[:end].rstrip("\\"))) % 2 == 1
                if not escaped:
                    break
            pos = end + 1
    return False


def _bounded_text(text: str | bytes) -> str:
    if len(text) > MAX_BYTES:
        raise YAMLLimitError(None, None, f"larger than {MAX_BYTES // (1024 * 1024)} MiB", None)
    decoded = text.decode("utf-8") if isinstance(text, bytes) else text
    if _flow_depth_over(decoded, MAX_DEPTH):
        raise YAMLLimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", None)
    return decoded


def read_bounded(path: Path, limit: int = MAX_BYTES) -> bytes:
    """A regular file's first bytes, at most `limit` + 1 (a FIFO, /dev/zero or a 10 GB file
    is refused, never read whole): OSError for what is not a regular file, YAMLLimitError for
    one larger than `limit`."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer (regular files ignore it)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise YAMLLimitError(None, None, f"larger than {limit // (1024 * 1024)} MiB", None)
    return data


def load_yaml(text: str | bytes) -> Any:
    """One YAML (or JSON) document, safely and within the limits above; yaml.YAMLError if not."""
    loader = _BoundedLoader(_bounded_text(text))
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml_all(text: str | bytes) -> list[Any]:
    """Every document of a YAML stream, within the same limits (MAX_NODES per document)."""
    loader = _BoundedLoader(_bounded_text(text))
    try:
        documents = []
        while loader.check_data():
            documents.append(loader.get_data())
        return documents
    finally:
        loader.dispose()


# ---- showing values --------------------------------------------------------------------------

# C0/C1 controls, DEL, and the format characters that reorder or hide text in a terminal.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """A message as it may reach a terminal or a log: control characters escaped (newlines
    and tabs kept), cut to `limit` characters with the length said."""
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return _UNSAFE.sub(_escape, text)


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """repr() of a value for a message: cut to `limit` characters first (a 10 MB value is not
    printed back), every control character escaped (repr does it for strings; the cut keeps
    the escaping)."""
    if isinstance(value, str):
        cut = value if len(value) <= limit else value[:limit]
        text = repr(cut)
        return text if cut is value else f"{text}… ({len(value)} characters)"
    text = repr(value)
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return _UNSAFE.sub(_escape, text).replace("\n", "\\n").replace("\r", "\\r")
