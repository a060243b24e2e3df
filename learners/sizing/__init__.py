"""Task sizing: one Sizer protocol, every published algorithm (bucketing, Tovar et al., k-Segments,
Ponder, Witt et al.) and ours (budget, select) behind ``make_sizer``."""

from learners.sizing.base import Exhaustion, Record, Sizer, TaskFeatures, Unfittable
from learners.sizing.registry import (
    COMPANION,
    COMPANIONS,
    DEFAULT_SIZER,
    MEMORY_ONLY,
    SIZERS,
    make_sizer,
    split_sizer,
)

__all__ = [
    "COMPANION",
    "COMPANIONS",
    "DEFAULT_SIZER",
    "MEMORY_ONLY",
    "SIZERS",
    "Exhaustion",
    "Record",
    "Sizer",
    "TaskFeatures",
    "Unfittable",
    "make_sizer",
    "split_sizer",
]
