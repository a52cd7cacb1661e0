"""Slurm's compressed host lists (``node[01-04,07],login1``) as host names: :func:`expand_hostlist`."""

from __future__ import annotations

import re


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list as names: ``node[01-03,07],login1`` -> node01, node02, node03, node07, login1.

    Several bracket groups in one name multiply (``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2); a range keeps
    the zero padding of its start. ValueError naming the list for anything else (unbalanced brackets, a
    range that runs backwards, an empty name).
    """
    names: list[str] = []
    for item in _top_level_items(text):
        names += _expand_name(item, text)
    if not names:
        raise ValueError(f"host list {text!r} names no host; valid: e.g. node[01-04,07],login1")
    return names


def _top_level_items(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"host list {text!r} has unbalanced brackets; valid: e.g. node[01-04,07],login1")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {text!r} has unbalanced brackets; valid: e.g. node[01-04,07],login1")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_name(item: str, text: str) -> list[str]:
    """One name of a host list with its bracket groups expanded."""
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if match is None:
        return [item]
    head, ranges, tail = match.groups()
    numbers = []
    for part in ranges.split(","):
        bounds = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if bounds is None or (bounds[2] is not None and int(bounds[2]) < int(bounds[1])):
            raise ValueError(f"host list {text!r}: {part!r} in [{ranges}] is not a number or a range low-high; "
                             "valid: e.g. node[01-04,07]")
        low, high = int(bounds[1]), int(bounds[2] or bounds[1])
        numbers += [str(n).zfill(len(bounds[1])) for n in range(low, high + 1)]
    return [head + n + rest for n in numbers for rest in _expand_name(tail, text)]
