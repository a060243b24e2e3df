"""When a model fit on all of a learner's records is fit again.

Greedy Bucketing, k-Segments, Witt's and Ponder's regressions fit their model on every
record of a category, so a fit after every record costs a stage of ``n`` tasks ``O(n^2)``:
a stage of 30,000 tasks spent minutes in its sizer. A model is fit again at every record
for a category's first :data:`SPAN` records, then once its records have grown by a
``1 / SPAN`` share since the last fit, which keeps the cost per task flat (about ``SPAN``
records' worth of fitting) and leaves a model at most ``1 / SPAN`` of its records behind.
cctools' bucketing has the same knob at a fixed count (``update_epoch``, 1 by default).
"""

from __future__ import annotations

from dataclasses import dataclass

SPAN = 256
"""A model is fit again once its records grow by ``1 / SPAN`` of those it was fit on."""


@dataclass(slots=True)
class Refits:
    """The records a model was last fit on, and whether it is due again."""

    fitted: int = -1
    """Records at the last fit (-1: never fit)."""

    def due(self, records: int) -> bool:
        """Whether a model fit on :attr:`fitted` records is to be fit again on ``records``."""
        return self.fitted < 0 or records - self.fitted >= max(1, self.fitted // SPAN)

    def fit(self, records: int) -> None:
        """The model was fit on ``records`` records."""
        self.fitted = records
