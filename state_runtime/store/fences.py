"""Fences: the first and last index key of each of a sequence of sorted, disjoint ranges (the
blocks of a run on disk, the parts of a level), and the searches over them both share."""

from __future__ import annotations

import numpy as np


def holding(firsts: np.ndarray, lasts: np.ndarray, index: np.ndarray) -> np.ndarray:
    """For each index key, the range that holds it, or -1."""
    at = np.searchsorted(firsts, index, side="right") - 1
    inside = (at >= 0) & (index <= lasts[np.maximum(at, 0)])
    return np.where(inside, at, -1)


def overlapping(firsts: np.ndarray, lasts: np.ndarray, lo: int, hi: int) -> range:
    """The ranges holding some index key in ``[lo, hi]``."""
    first = int(np.searchsorted(lasts, np.int64(lo), side="left"))
    return range(first, int(np.searchsorted(firsts, np.int64(hi), side="right")))
