"""The agent: what a pilot runs on each node (``leadtime worker``), in a room of its own.

Its modules import no learner and no numpy, nothing of the manager's side, only the lowest
layers (:mod:`backends.clock`, :mod:`backends.base`, :mod:`backends.cores`,
:mod:`learners.resources`) and each
other: a worker starts fast on a compute node (``tests/test_imports.py`` holds this). The
manager's side imports :mod:`.protocol` and :mod:`.attempt`, the two both sides share.
"""
