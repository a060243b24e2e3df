"""What an edit of a workflow changed, for a run taken up with its file as it is now.

A user whose run failed on a mistake in the file (a command, an output's name) fixes it and
takes the run up again (``leadtime run FILE --resume``). What the run finished stays
finished where nothing it depended on changed: a stage whose tasks run something else now
(their commands, items or outputs) runs again whole, and so does every stage after it,
which read what it wrote. Allocations and sizes may change freely: they say where tasks
run, not what they do. The stages, their order and their task counts must stay as they
were: the run's record names its tasks by stage and index.
"""

from __future__ import annotations

from workflows.spec import Stage, Workflow


class Reshaped(ValueError):
    """The edit changed the workflow's shape (its stages, their order or task counts): the
    run's record no longer says which of its tasks finished."""


def changed_stages(recorded: Workflow, edited: Workflow) -> frozenset[str]:
    """The stages of ``edited`` that must run again from their beginning: those whose tasks
    differ from ``recorded``'s, and every stage after one of them.

    Raises :class:`Reshaped` if the two differ in anything but tasks and sizes.
    """
    _same_shape(recorded, edited)
    before = {stage.name: stage for stage in recorded.stages}
    changed = {s.name for s in edited.stages if _tasks(s) != _tasks(before[s.name])}
    grew = bool(changed)
    while grew:  # a file may list a stage before one it comes after
        later = {s.name for s in edited.stages if changed & set(s.after)} - changed
        changed |= later
        grew = bool(later)
    return frozenset(changed)


def _same_shape(recorded: Workflow, edited: Workflow) -> None:
    names = [s.name for s in recorded.stages]
    if [s.name for s in edited.stages] != names:
        now = ", ".join(s.name for s in edited.stages)
        raise Reshaped(f"its stages are {now}, the run's were {', '.join(names)}")
    for old, new in zip(recorded.stages, edited.stages, strict=True):
        if new.tasks.size != old.tasks.size:
            raise Reshaped(
                f"stage {new.name} has {new.tasks.size:,} tasks, the run's had {old.tasks.size:,}"
            )
        if set(new.after) != set(old.after):
            after = ", ".join(new.after) or "none"
            was = ", ".join(old.after) or "none"
            raise Reshaped(f"stage {new.name} comes after {after}, in the run after {was}")


def _tasks(stage: Stage) -> list[tuple[str, tuple[str, ...], str | None]]:
    """What each of the stage's tasks runs: its command, outputs and item."""
    return [(t.command, t.outputs, t.item) for t in stage.expand()]
