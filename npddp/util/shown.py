"""How an error message shows a value it rejects: briefly, never a whole array."""

from __future__ import annotations

import numpy as np

#: Longest repr an error message quotes; longer ones are cut with "...".
LIMIT = 60


def shown(value) -> str:
    """``value`` for an error message: an array as its type, shape and dtype, anything else as its repr, cut short."""
    if isinstance(value, np.ndarray) and value.ndim:
        return f"ndarray of shape {value.shape} {value.dtype}"
    text = repr(value)
    return text if len(text) <= LIMIT else text[:LIMIT - 3] + "..."
