"""A worker as the pool and the run's state see it, with nothing behind it: for tests that
place attempts without running them."""

from dataclasses import dataclass

from learners.resources import Resources

NODE = Resources(cores=2, memory=4000, disk=4000)


@dataclass
class Node:
    id: str
    pilot_id: str
    capacity: Resources = NODE
    end_time: float = 1e9
    accepting: bool = True
    queues: bool = False
