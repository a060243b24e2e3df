"""An append-only numpy array: learners fit on all their records, so the records must
already be an array, not a list to convert each time."""

from __future__ import annotations

import numpy as np


class Growing:
    """Rows of ``width`` floats (or scalars when ``width`` is None), appended in amortised O(1)."""

    def __init__(self, width: int | None = None, capacity: int = 64) -> None:
        shape = (capacity,) if width is None else (capacity, width)
        self._data = np.empty(shape)
        self.n = 0

    def append(self, row: float | np.ndarray) -> None:
        if self.n == len(self._data):
            self._data = np.concatenate((self._data, np.empty_like(self._data)))
        self._data[self.n] = row
        self.n += 1

    @property
    def values(self) -> np.ndarray:
        """The rows so far (a view: copy before keeping it past the next append)."""
        return self._data[: self.n]

    def __len__(self) -> int:
        return self.n
