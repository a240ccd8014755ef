"""The check every config file and override value passes before omegaconf reads it: YAML as plain data.

A config says values (text, numbers, true/false, null, lists, mappings); nothing is built from it.
So a tag is refused unless it is ``!!str``, ``!!seq`` or ``!!map`` (``!!binary`` would turn a path into
bytes; ``!!set``, ``!!timestamp``, ``!!python/...`` and local ``!tags`` build objects), and so are a
key given twice in one mapping, an alias inside the node it names, nesting deeper than
:data:`MAX_YAML_DEPTH`, a number too long to convert, and a document that aliases expand past the
limits omegaconf 2.4 reads YAML with (so that its own check never answers in its words).

The text is composed, not constructed, with YAML's base loader, where only a tag written in the text
is a tag; every problem found is raised at once (:class:`NotPlainYaml`), each with its line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import yaml

from megatron.bridge.training.config_stages.reading.shown import short_text

_YAML_TAG = "tag:yaml.org,2002:"
PLAIN_TAGS = frozenset(_YAML_TAG + name for name in ("str", "seq", "map"))
"""The tags a config may carry: what every untagged value has, and ``!!str`` to keep a text a text."""
MAX_YAML_NODES = 10_000
"""Nodes a document may hold once its aliases are expanded (a whole saved config holds about 1,000)."""
ALIAS_GROWTH_FROM, MAX_ALIAS_GROWTH = 1_000, 100
"""Past ``ALIAS_GROWTH_FROM`` nodes, aliases may repeat the nodes written at most ``MAX_ALIAS_GROWTH`` times."""
MAX_YAML_DEPTH = 32
"""Levels of nesting (a config's deepest value is three or four levels down)."""
MAX_NUMBER_DIGITS = 100
"""Digits of a number (Python refuses to convert integers of more than 4,300)."""

_BASE_LOADER = getattr(yaml, "CBaseLoader", yaml.BaseLoader)

ProblemKind = Literal["tag", "duplicate-key", "recursive-alias", "too-large", "number"]


@dataclass(frozen=True)
class YamlProblem:
    """One reason a text is not plain data: its kind, where (1-based line and column) and why."""

    kind: ProblemKind
    line: int
    column: int
    message: str


PROBLEM_FIXES: dict[ProblemKind, str] = {
    "tag": "write the value itself; quote it ('...') if it is a string that starts with '!'",
    "duplicate-key": "give the key once: delete the one you did not mean",
    "recursive-alias": "point the alias (*name) at a node outside the one it is in",
    "too-large": "write each value once (fewer *aliases) and nest values only as the config's sections do",
    "number": "write the number the field takes",
}
"""The fix of each kind of problem, in a file or an override value alike."""


class NotPlainYaml(yaml.YAMLError):
    """Every :class:`YamlProblem` of one text (valid YAML that is not plain data)."""

    def __init__(self, problems: list[YamlProblem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


def plain_yaml_root(text: str) -> yaml.Node | None:
    """The composed document of ``text`` (``None`` when it is empty) once it is known to be plain data.

    Raises ``yaml.YAMLError`` for malformed YAML and :class:`NotPlainYaml` listing every problem.
    """
    root = yaml.compose(text, Loader=_BASE_LOADER)
    if root is not None:
        problems = _Walk(root).problems
        if problems:
            raise NotPlainYaml(problems)
    return root


def _problem(kind: ProblemKind, node: yaml.Node, message: str) -> YamlProblem:
    mark = node.start_mark
    return YamlProblem(kind, mark.line + 1, mark.column + 1, message)


def _shown_tag(tag: str) -> str:
    return short_text("!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag, 80)


def _children(node: yaml.Node, path: str) -> Iterator[tuple[yaml.Node, str]]:
    """The nodes right under ``node`` (keys too), each with the dotted path a message names it by."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = short_text(key.value, 40) if isinstance(key, yaml.ScalarNode) else "?"
            yield key, path
            yield value, f"{path}.{name}" if path else name
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield item, f"{path}[{i}]"


class _Walk:
    """One pass over a composed document (no recursion: a deep document cannot overflow the stack):
    each node written is checked once, and the nodes its aliases expand to are counted."""

    def __init__(self, root: yaml.Node) -> None:
        self.problems: list[YamlProblem] = []
        self.expanded: dict[int, int] = {}
        self.too_deep = False
        self._run(root)
        self._check_size(root)

    def _run(self, root: yaml.Node) -> None:
        on_path = {id(root)}
        self._check(root, "")
        stack = [(root, _children(root, ""))]
        while stack:
            node, children = stack[-1]
            child, path = next(children, (None, ""))
            if child is None:
                stack.pop()
                on_path.discard(id(node))
                self._count(node)
            elif id(child) in on_path:
                self.problems.append(
                    _problem(
                        "recursive-alias",
                        child,
                        f"the alias at {short_text(path, 80) or 'the top'} is "
                        "inside the node it names, so its value never ends",
                    )
                )
            elif id(child) not in self.expanded and self._deep_enough(child, path, len(stack)):
                on_path.add(id(child))
                self._check(child, path)
                stack.append((child, _children(child, path)))

    def _deep_enough(self, node: yaml.Node, path: str, depth: int) -> bool:
        """Whether ``node`` is within :data:`MAX_YAML_DEPTH` (the first one past it is a problem)."""
        if depth < MAX_YAML_DEPTH:
            return True
        self.expanded[id(node)] = 1
        if not self.too_deep:
            self.too_deep = True
            self.problems.append(
                _problem(
                    "too-large", node, f"values nest deeper than {MAX_YAML_DEPTH} levels (at {short_text(path, 80)})"
                )
            )
        return False

    def _count(self, node: yaml.Node) -> None:
        total = 1 + sum(self.expanded.get(id(child), 0) for child, _ in _children(node, ""))
        self.expanded[id(node)] = min(total, MAX_YAML_NODES + 1)

    def _check(self, node: yaml.Node, path: str) -> None:
        """The problems of one node written in the text: its tag, its keys, its digits."""
        where = f" at {short_text(path, 80)}" if path else ""
        if node.tag not in PLAIN_TAGS:
            self.problems.append(
                _problem(
                    "tag",
                    node,
                    f"YAML tags are not read ({_shown_tag(node.tag)}{where}): "
                    "values are plain data, nothing is built from a tag",
                )
            )
        if isinstance(node, yaml.MappingNode):
            self._check_keys(node, path)
        elif isinstance(node, yaml.ScalarNode) and not node.style:  # plain (unquoted): None, or '' from libyaml
            digits = node.value.lstrip("+-").replace("_", "")
            if digits.isascii() and digits.isdigit() and len(digits) > MAX_NUMBER_DIGITS:
                self.problems.append(
                    _problem(
                        "number",
                        node,
                        f"a number of {len(digits):,} digits{where}; a config number has at most {MAX_NUMBER_DIGITS}",
                    )
                )

    def _check_keys(self, node: yaml.MappingNode, path: str) -> None:
        first_line: dict[str, int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value not in first_line:
                first_line[key.value] = line
                continue
            dotted = short_text(f"{path}.{key.value}" if path else key.value, 80)
            lines = f" (lines {first_line[key.value]} and {line})" if first_line[key.value] != line else ""
            self.problems.append(
                _problem(
                    "duplicate-key", key, f"the key {dotted} is given twice{lines}: which value is meant is unclear"
                )
            )

    def _check_size(self, root: yaml.Node) -> None:
        total, written = self.expanded.get(id(root), 1), len(self.expanded)
        if total > MAX_YAML_NODES:
            message = (
                f"the document holds more than {MAX_YAML_NODES:,} YAML nodes once its aliases are expanded "
                f"({written:,} written)"
            )
        elif total > ALIAS_GROWTH_FROM and total > MAX_ALIAS_GROWTH * written:
            message = (
                f"aliases repeat the document's {written:,} YAML nodes to {total:,}, more than "
                f"{MAX_ALIAS_GROWTH} times over"
            )
        else:
            return
        self.problems.append(_problem("too-large", root, message))
