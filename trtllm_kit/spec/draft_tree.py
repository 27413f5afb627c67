"""The tree of draft tokens a Medusa or EAGLE engine verifies each step: paths of top-k indices, one per depth
(``[[0], [0, 0], [1]]``: the first head's top token, the second's top token after it, the first head's second
token). Given with ``--draft-choices`` as upstream's examples write it, or the top-1 path of K tokens; written for
the ``tensorrt_llm`` model in the backend's spelling (``"{0}, {0, 0}, {1}"``, ``docs/model_config.md``)."""

from __future__ import annotations

import json
from collections import Counter

from trtllm_kit.errors import KitUsageError

Path = tuple[int, ...]


def parse_choices(text: str) -> tuple[Path, ...]:
    """The paths of ``--draft-choices``, refused in one sentence unless they form a tree.

    Arguments:
        text: a JSON list of paths, each a non-empty list of top-k indices (>= 0).
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not value or not all(
            isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in p)
            for p in value):
        raise KitUsageError(f"--draft-choices {text!r} is not a list of paths of top-k indices; pass e.g. "
                            "'[[0], [0, 0], [1]]'.")
    paths = tuple(tuple(p) for p in value)
    seen = set(paths)
    if len(seen) != len(paths):
        twice = next(p for p in paths if paths.count(p) > 1)
        raise KitUsageError(f"--draft-choices names the path {list(twice)} twice; name each path once.")
    orphan = next((p for p in paths if len(p) > 1 and p[:-1] not in seen), None)
    if orphan is not None:
        raise KitUsageError(f"--draft-choices has the path {list(orphan)} without its parent {list(orphan[:-1])}; "
                            "add the parent.")
    return paths


def top1_chain(draft_len: int) -> tuple[Path, ...]:
    """The top-1 path of ``draft_len`` tokens: ``[0], [0, 0], ...``.

    Arguments:
        draft_len: K.
    """
    return tuple((0,) * depth for depth in range(1, draft_len + 1))


def depth(paths: tuple[Path, ...]) -> int:
    """The tree's depth: the longest path."""
    return max(len(p) for p in paths)


def max_non_leaves(paths: tuple[Path, ...]) -> int:
    """The most nodes with children at any one depth."""
    parents = Counter(len(p) for p in paths if any(q[:-1] == p for q in paths))
    return max(parents.values(), default=0)


def choices_text(paths: tuple[Path, ...]) -> str:
    """The tree in the backend's ``medusa_choices`` / ``eagle_choices`` spelling.

    Arguments:
        paths: the tree's paths.
    """
    return ", ".join("{" + ", ".join(str(i) for i in p) + "}" for p in paths)
