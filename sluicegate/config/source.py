"""YAML text -> plain data plus the line of every key, and key paths for messages.

PyYAML's `safe_load` forgets where things were and silently keeps the last of
duplicate keys. Here the text is composed into nodes first; one walk over the
nodes records each key's line and reports duplicate keys, then the nodes are
constructed into ordinary Python data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .problems import DOCUMENT, Problem, Severity

KeyPath = tuple[str | int, ...]
"""A place in the document: str for mapping keys, int for list indices."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def format_key_path(path: KeyPath) -> str:
    """`("routes", 0, "backends", 2, "provider")` -> `routes[0].backends[2].provider`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out or DOCUMENT


@dataclass(frozen=True)
class SourceMap:
    """Line (1-based) of every key in a document; list items map to the item's line."""

    lines: Mapping[KeyPath, int] = field(default_factory=dict)
    root_line: int = 1

    def has(self, path: KeyPath) -> bool:
        return path in self.lines

    def line_of(self, path: KeyPath) -> int:
        """Line of `path`, or of its nearest ancestor present in the file (a missing key)."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return self.root_line


@dataclass(frozen=True)
class Locator:
    """Makes Problems for one file, turning key paths into lines."""

    file: str
    source: SourceMap

    def problem(self, path: KeyPath, message: str, severity: Severity = "error") -> Problem:
        return Problem(
            self.file, self.source.line_of(path), format_key_path(path), message, severity
        )

    def error(self, path: KeyPath, message: str) -> Problem:
        return self.problem(path, message, "error")

    def warning(self, path: KeyPath, message: str) -> Problem:
        return self.problem(path, message, "warning")

    def document(self, message: str, line: int = 1) -> Problem:
        return Problem(self.file, line, DOCUMENT, message)


@dataclass(frozen=True)
class ParsedYaml:
    """Result of reading YAML text: plain data, key lines, and the problems found.

    `data` is None when the text holds no document or cannot be read (see `problems`).
    """

    data: object
    source: SourceMap
    problems: list[Problem]


# libyaml's parser is ~5x faster (1,000 routes: 0.13 s against 0.72 s); it builds the same
# nodes with the same marks, so line numbers do not change.
_FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str, file: str) -> ParsedYaml:
    """Read one YAML document, recording key lines and reporting duplicate keys."""
    try:
        return _parse_with(_FAST_LOADER, text, file)
    except UnicodeEncodeError:
        # libyaml cannot take text it cannot encode (a lone surrogate); the pure-Python
        # reader reports such a character with its line.
        return _parse_with(yaml.SafeLoader, text, file)


def _parse_with(loader_class: type[yaml.SafeLoader], text: str, file: str) -> ParsedYaml:
    loader: yaml.SafeLoader | None = None
    try:
        loader = loader_class(text)  # raises ReaderError on control characters
        node = loader.get_single_node()
        if node is None:
            return ParsedYaml(None, SourceMap(), [])
        walk = _Walk(loader, file)
        walk.visit(node, ())
        data = _construct(loader, node)
    except _Unreadable as exc:
        return _unreadable(file, exc.line, exc.message)
    except yaml.MarkedYAMLError as exc:
        return _unreadable(file, _marked_error_line(exc, text), _marked_error_message(exc, text))
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        return _unreadable(file, line, f"invalid YAML: {exc.reason} ({_char(exc.character)})")
    except yaml.YAMLError as exc:
        return _unreadable(file, 1, f"invalid YAML: {exc}")
    except RecursionError:
        return _unreadable(file, 1, "invalid YAML: the document is nested too deeply")
    finally:
        if loader is not None:
            loader.dispose()
    source = SourceMap(walk.lines, node.start_mark.line + 1)
    return ParsedYaml(data, source, walk.problems)


class _Unreadable(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def _construct(loader: yaml.SafeLoader, node: Node) -> object:
    """Nodes -> Python data, turning a scalar that cannot be built into `_Unreadable`."""
    try:
        return loader.construct_document(node)
    except (yaml.YAMLError, RecursionError):
        raise
    except Exception as exc:
        # A scalar that matched a tag but cannot be built: date 2024-13-01, `!!int x`, `!!int`.
        # PyYAML raises whatever its converter raised (ValueError, IndexError, ...).
        detail = str(exc) or type(exc).__name__
        raise _Unreadable(_first_bad_scalar_line(node), f"invalid YAML value: {detail}") from None


def _unreadable(file: str, line: int, message: str) -> ParsedYaml:
    return ParsedYaml(None, SourceMap(), [Problem(file, line, DOCUMENT, message)])


# Errors inside something opened earlier and never closed: the user's mistake is where it
# was opened (an unclosed `[` is found only at the next key, lines later), so that line is
# reported and the later one named in the message.
_OPENERS = {
    "while parsing a flow sequence": "'['",
    "while parsing a flow mapping": "'{'",
    "while scanning a quoted scalar": "quote",
}


def _marked_error_line(exc: yaml.MarkedYAMLError, text: str) -> int:
    if _opened_earlier(exc, text) and exc.context_mark is not None:
        return int(exc.context_mark.line) + 1
    mark = exc.problem_mark or exc.context_mark
    return mark.line + 1 if mark is not None else 1


def _marked_error_message(exc: yaml.MarkedYAMLError, text: str) -> str:
    if _opened_earlier(exc, text) and exc.problem_mark is not None:
        opener = _OPENERS[exc.context or ""]
        return (
            f"invalid YAML: a {opener} on this line is not closed before line "
            f"{exc.problem_mark.line + 1}: {exc.problem}"
        )
    message = f"invalid YAML: {exc.problem or exc.context or 'cannot parse'}"
    if exc.problem and exc.context:
        where = f" at line {exc.context_mark.line + 1}" if exc.context_mark is not None else ""
        message += f" ({exc.context}{where})"
    return message


def _opened_earlier(exc: yaml.MarkedYAMLError, text: str) -> bool:
    """Whether the error is in a flow collection or quoted text opened on an earlier line
    and never closed. A collection closed later (a comma missing inside it) or a quote
    closed later (a bad escape) is reported where the parser stopped, as usual."""
    if not (
        exc.context in _OPENERS
        and exc.problem is not None
        and exc.context_mark is not None
        and exc.problem_mark is not None
        and exc.context_mark.line < exc.problem_mark.line
    ):
        return False
    if exc.context == "while scanning a quoted scalar":
        return "end of stream" in exc.problem
    return not _flow_closed(text, exc.context_mark)


def _flow_closed(text: str, mark: yaml.Mark) -> bool:
    """Whether the `[` or `{` at `mark` has its closing bracket somewhere in `text`
    (quoted text and comments skipped). Found by line and column, which both of PyYAML's
    parsers count in characters."""
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: mark.line]) + mark.column
    depth, quote, index = 0, "", start
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "#" and text[index - 1] in " \t\n":
            index = text.find("\n", index)
            if index < 0:
                break
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return True
        index += 1
    return False


def _char(character: object) -> str:
    if isinstance(character, int):  # PyYAML gives the code point of the bad character
        return f"character U+{character:04X}"
    return "unreadable character"


def _first_bad_scalar_line(root: Node) -> int:
    probe = yaml.SafeLoader("")
    seen: set[int] = set()
    stack = [root]
    try:
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ScalarNode):
                try:
                    probe.construct_object(node)
                except Exception:
                    return int(node.start_mark.line) + 1
            elif isinstance(node, SequenceNode):
                stack.extend(reversed(node.value))
            elif isinstance(node, MappingNode):
                for key, value in reversed(node.value):
                    stack.extend((value, key))
    finally:
        probe.dispose()
    return int(root.start_mark.line) + 1


class _Walk:
    """One pass over composed nodes: key lines per path, and duplicate-key problems.

    Each node is entered once (aliases may share nodes and even form cycles), so
    the walk is linear in the size of the text.
    """

    def __init__(self, loader: yaml.SafeLoader, file: str) -> None:
        self._loader = loader
        self._file = file
        self._seen: set[int] = set()
        self.lines: dict[KeyPath, int] = {}
        self.problems: list[Problem] = []

    def visit(self, node: Node, path: KeyPath) -> None:
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        if isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                self.lines[(*path, index)] = item.start_mark.line + 1
                self.visit(item, (*path, index))
        elif isinstance(node, MappingNode):
            self._visit_mapping(node, path)

    def _visit_mapping(self, node: MappingNode, path: KeyPath) -> None:
        first_line: dict[object, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # `<<: *base` entries are merged in by the constructor
            key = self._key(key_node)
            child = (*path, str(key))
            line = key_node.start_mark.line + 1
            if key in first_line:
                self.problems.append(
                    Problem(
                        self._file,
                        line,
                        format_key_path(child),
                        f"duplicate key {_quote(key)} (first at line {first_line[key]}); "
                        "YAML would silently keep only the last one",
                    )
                )
            else:
                first_line[key] = line
            self.lines[child] = line
            self.visit(value_node, child)

    def _key(self, node: Node) -> object:
        if isinstance(node, ScalarNode):
            try:
                key = self._loader.construct_object(node)
                hash(key)
            except Exception:  # reported when the document is constructed
                return node.value
            return key
        # A list or mapping as a key: the constructor rejects it as unhashable later.
        return f"<{type(node).__name__} at line {node.start_mark.line + 1}>"


def _quote(key: object) -> str:
    return repr(key) if isinstance(key, str) else str(key)
