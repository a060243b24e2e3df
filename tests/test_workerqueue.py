"""The manager's copy of a worker agent's queue agrees with the agent, messages in flight or not.

The agent here follows the worker's rule (``Agent._start_waiting``): what it is sent waits in
the order it came, and the first starts while it fits what is free. Messages each way are
delivered in order, at any moment."""

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from learners.resources import Resources
from orchestrator.workerqueue import Key, WorkerQueue

CAPACITY = Resources(cores=4, memory=4000, disk=100)
SIZES = [Resources(cores=c, memory=m, disk=1) for c in (0.5, 1, 2, 4) for m in (500, 3000)]


class ModelAgent:
    def __init__(self) -> None:
        self.free = CAPACITY
        self.waiting: dict[Key, Resources] = {}
        self.running: dict[Key, Resources] = {}

    def receive(self, key: Key, allocation: Resources) -> list[Key]:
        self.waiting[key] = allocation
        return self._start()

    def finish(self, key: Key) -> None:
        self.free = self.free.plus(self.running.pop(key))
        self._start()

    def _start(self) -> list[Key]:
        started = []
        while self.waiting:
            key, allocation = next(iter(self.waiting.items()))
            if not allocation.fits_in(self.free):
                break
            del self.waiting[key]
            self.running[key] = allocation
            self.free = self.free.minus(allocation)
            started.append(key)
        return started


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("sdfh"), st.integers(0, 63)), max_size=120))
def test_the_copy_never_calls_running_what_waits_and_agrees_once_messages_arrive(ops):
    copy, agent = WorkerQueue(CAPACITY), ModelAgent()
    to_agent: deque[tuple[Key, Resources]] = deque()
    to_manager: deque[Key] = deque()
    sent = 0
    for op, n in ops:
        if op == "s":  # the manager sends an attempt
            key, allocation = ("t", sent), SIZES[n % len(SIZES)]
            sent += 1
            copy.sent(key, allocation)
            to_agent.append((key, allocation))
        elif op == "d" and to_agent:  # the agent receives the oldest
            key, allocation = to_agent.popleft()
            started = agent.receive(key, allocation)
            if key in copy.running:  # called running while on its way: it starts on arrival
                assert key in started
        elif op == "f" and agent.running:  # an attempt ends on the agent: its result leaves
            key = list(agent.running)[n % len(agent.running)]
            agent.finish(key)
            to_manager.append(key)
        elif op == "h" and to_manager:  # the manager hears the oldest result
            copy.ended(to_manager.popleft())
        on_its_way = {key for key, _ in to_agent}
        assert copy.running.keys() <= agent.running.keys() | set(to_manager) | on_its_way
        assert not copy.running.keys() & agent.waiting.keys()
        assert copy.free.cores >= -1e-9
    while to_agent or to_manager:  # everything arrives
        if to_agent:
            agent.receive(*to_agent.popleft())
        else:
            copy.ended(to_manager.popleft())
    assert list(copy.waiting) == list(agent.waiting)
    assert copy.running == agent.running


def test_an_attempt_that_leaves_unstarted_frees_nothing_and_lets_the_next_start():
    copy = WorkerQueue(CAPACITY)
    big, small = Resources(cores=3, memory=10, disk=1), Resources(cores=1, memory=10, disk=1)
    assert copy.sent(("a", 1), big)
    assert not copy.sent(("b", 1), big)  # waits: 1 core free
    assert not copy.sent(("c", 1), small)  # behind b, though it would fit
    assert copy.ended(("b", 1)) == [("c", 1)]  # b left unstarted (lost): c is first, and fits
    assert copy.free.cores == 0
    assert copy.ended(("x", 9)) == []  # never here
    assert copy.ended(("a", 1)) == []
    assert copy.free.cores == 3 and not copy.waiting and list(copy.running) == [("c", 1)]
