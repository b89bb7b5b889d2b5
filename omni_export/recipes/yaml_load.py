"""The recipe files' YAML loader, bounded: PyYAML's safe loader composes the document to nodes first, and a document
whose aliases expand too far, that nests too deep, refers to itself or repeats a key is refused before any Python
object is built (the shipped recipes: at most 6.3 KB, 312 expanded nodes, depth 5)."""
from __future__ import annotations

import yaml

YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 32


class _TooLarge(Exception):
    """The YAML is beyond the loader's bounds (aliases expanding too far, nesting too deep)."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, composing the document to nodes first so ``_check_nodes`` can bound it before any
    Python object is built."""


def _check_nodes(root) -> None:
    """Refuse a document whose node graph, with every alias expanded, has more than ``YAML_MAX_NODES`` nodes, is
    nested deeper than ``YAML_MAX_DEPTH`` or refers to itself; and a mapping that repeats a key. Linear in the
    composed document: each node's expanded size is computed once."""
    size: dict[int, int] = {}
    active: set[int] = set()
    stack = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        if done:
            active.discard(id(node))
            children = _children(node)
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            if size[id(node)] > YAML_MAX_NODES:
                raise _TooLarge(f"expands to more than {YAML_MAX_NODES} nodes (aliases); write the values out")
            continue
        if id(node) in size:
            continue
        if id(node) in active:
            raise _TooLarge(f"refers to itself (an alias inside its own anchor, line {node.start_mark.line + 1})")
        if depth > YAML_MAX_DEPTH:
            raise _TooLarge(f"is nested more than {YAML_MAX_DEPTH} levels deep (line {node.start_mark.line + 1})")
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for k, _ in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if (k.tag, k.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"duplicate key {k.value!r} (first on line {seen[(k.tag, k.value)] + 1})", k.start_mark)
                    seen[(k.tag, k.value)] = k.start_mark.line
        active.add(id(node))
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in _children(node))


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [x for kv in node.value for x in kv]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml(text: str):
    """``yaml.safe_load`` within bounds: ``_TooLarge`` or a ``yaml.YAMLError`` (a duplicate key is one) before any
    Python object is built."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise _TooLarge(f"is nested more than {YAML_MAX_DEPTH} levels deep") from None
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
