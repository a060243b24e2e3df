"""Task sizing: one Sizer protocol, every algorithm of seeds 000-003 behind ``make_sizer``."""

from learners.sizing.base import Exhaustion, Record, Sizer, TaskFeatures, Unfittable
from learners.sizing.registry import SIZERS, make_sizer

__all__ = ["SIZERS", "Exhaustion", "Record", "Sizer", "TaskFeatures", "Unfittable", "make_sizer"]
