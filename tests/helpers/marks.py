"""The marks a backend's parameters carry, so runs across nodes select them by marker (setup.cfg lists the markers)."""

from __future__ import annotations

import pytest

#: hier and auto (which composes hier there) run again across pretended nodes; shm needs all ranks on one node.
_BACKEND_MARKS = {"hier": pytest.mark.across_nodes, "auto": pytest.mark.across_nodes, "shm": pytest.mark.one_node}


def marked_backend(name: str, id: str | None = None, value=None):
    """A parameter (``value``, else ``name``) carrying backend ``name``'s marks; ``id``: the test id, else ``name``."""
    return pytest.param(name if value is None else value, id=id or name, marks=_BACKEND_MARKS.get(name, ()))
