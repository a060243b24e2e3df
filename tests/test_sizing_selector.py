"""The online selector allocates, per category, with the candidate whose shadow score is best."""

from __future__ import annotations

import pytest

from backends import clock
from backends.sim.backend import MockSlurm
from backends.sim.workload import ClusterSpec
from learners.kill_times import CALIBRATED, KILL_SHARE, kill_share
from learners.replay import TraceTask, replay
from learners.resources import Resources
from learners.sizing import Exhaustion, Record, TaskFeatures, make_sizer
from learners.sizing.bucketing import SAMPLING
from learners.sizing.budget import BUDGET
from learners.sizing.composite import PRIOR_FLOOR
from learners.sizing.history import History
from learners.sizing.selector import WARMUP, WORKFLOW_BUDGET, Selector, Shadow
from orchestrator.engine import Engine
from orchestrator.planner import PerStage
from orchestrator.simulate import SimulatedWorkers, task_truths
from orchestrator.store import Store
from workflows.spec import loads

WORKER = Resources(16, 64000, 64000)


def selector() -> Selector:
    names = ("whole", "budget", "user")
    return Selector("test", [make_sizer(n, worker=WORKER) for n in names])


def record(category: str, memory: float, requested: float = 0.0) -> Record:
    task = TaskFeatures(category, requested={"memory": requested} if requested else {})
    return Record(task, Resources(1, memory, 100, 60))


def test_steady_tasks_choose_the_tight_quantile():
    s = selector()
    for _ in range(WARMUP + 20):
        s.observe(record("steady", 2000))
    scores = [shadow.score for shadow in s.shadows["steady"]]
    assert s.chosen("steady") is s.candidates[1]
    assert scores[1] == max(scores) and scores[1] > 5 * scores[0]


def test_growing_tasks_shun_the_candidate_they_keep_killing():
    s = selector()
    for i in range(WARMUP + 20):  # each task needs more than the largest before, grown by 1 / n
        s.observe(record("growing", 1000 * (i + 1) ** 1.2, requested=60000))
    scores = [shadow.score for shadow in s.shadows["growing"]]
    assert s.shadows["growing"][1].kills == WARMUP + 19
    assert s.chosen("growing") is s.candidates[2]  # the request: above every peak, never killed
    assert scores[2] == max(scores)


def test_categories_choose_apart_and_the_first_candidate_warms_up():
    s = selector()
    for _ in range(WARMUP + 5):
        s.observe(record("steady", 2000))
    s.observe(record("new", 2000))
    assert s.chosen("new") is s.candidates[0]
    assert s.allocate(TaskFeatures("new")).memory == WORKER.memory
    records = WARMUP + 5  # too few for the quantile: the largest, grown by 1 / n
    assert s.allocate(TaskFeatures("steady")).memory == pytest.approx(2000 * (1 + 1 / records))


def test_the_default_is_the_selector():
    sizer = make_sizer("select", worker=WORKER)
    assert isinstance(sizer, Selector)
    assert [c.name for c in sizer.candidates] == [
        "budget",
        "ksegments+budget",
        "ponder+budget",
        "greedy-det",
        "exhaust-det",
    ]
    assert sizer.retrying == (False, False, False, True, True)


def test_a_real_kill_counts_against_the_candidate_allocating():
    s = selector()
    for _ in range(WARMUP + 20):
        s.observe(record("steady", 2000))
    assert s.chosen("steady") is s.candidates[1]
    task = TaskFeatures("steady")
    for _ in range(2):  # what the shadow could not see: tasks that started with fewer records
        s.observe_exhaustion(task, s.allocate(task), Exhaustion("memory", 2500))
    assert s.shadows["steady"][1].kills == 2
    assert s.shadows["steady"][1].killed > BUDGET  # beyond the budget: the fewest kills win
    assert s.chosen("steady") is not s.candidates[1]


def test_a_retry_follows_the_first_candidate_s_rule():
    sizer = make_sizer("select", worker=WORKER)
    task = TaskFeatures("a", input_size=1e9)
    for i in range(WARMUP + 20):
        sizer.observe(Record(TaskFeatures("a", input_size=1e9 + i), Resources(1, 2000, 100, 60)))
    first = sizer.allocate(task)
    killed = Exhaustion("memory", first.memory + 1)
    retry = sizer.allocate(task, first, killed)
    assert retry == sizer.candidates[0].allocate(task, first, killed)
    assert retry.memory == 2 * killed.measured  # twice what it reached, above the largest seen


def _mixed_history() -> list[Record | tuple[TaskFeatures, Exhaustion]]:
    """Records of two categories, with kills between them, as a run ends them."""
    events: list[Record | tuple[TaskFeatures, Exhaustion]] = []
    for i in range(3 * WARMUP):
        events.append(record("a", 1000 + 37 * (i % 7)))
        events.append(record("b", 4000 * (1 + i / 10)))
        if i % 4 == 3:
            events.append((TaskFeatures("b"), Exhaustion("memory", 4000 * (1 + i / 10))))
    return events


def test_learning_late_ends_as_learning_at_once():
    """The selector learns when an allocation needs it; what it learns does not depend on when."""
    eager, late = selector(), selector()
    given = []
    for event in _mixed_history():
        for s in (eager, late):
            if isinstance(event, Record):
                s.observe(event)
            else:
                task, exhaustion = event
                s.observe_exhaustion(task, s.allocate(task), exhaustion)
        given.append(eager.allocate(TaskFeatures("a")))  # the eager one learns at every end
    assert eager.allocate(TaskFeatures("b")) == late.allocate(TaskFeatures("b"))
    assert eager.allocate(TaskFeatures("a")) == late.allocate(TaskFeatures("a")) == given[-1]
    for category in ("a", "b"):
        assert [vars(x) for x in eager.shadows[category]] == [
            vars(x) for x in late.shadows[category]
        ]
        assert eager.chosen(category).name == late.chosen(category).name


def test_tasks_of_declared_sizes_leave_the_candidates_unlearnt_but_the_history_full():
    s = make_sizer("select", worker=WORKER)
    declared = TaskFeatures("fixed", declared={"cores": 1, "memory": 500, "disk": 10})
    for _ in range(WARMUP + 3):
        assert s.allocate(declared) == Resources(1, 500, 10)
        s.observe(Record(declared, Resources(1, 400, 5, 60)))
    assert len(list(History.records(s.state()))) == WARMUP + 3
    assert all(not c.state()["categories"] for c in s.candidates)
    learnt = s.allocate(TaskFeatures("fixed")).memory  # asked: it learns what it was told
    assert all(c.state()["categories"] for c in s.candidates)
    assert 400 <= learnt < PRIOR_FLOOR["memory"]


def test_a_candidate_that_regresses_on_input_size_waits_for_tasks_that_report_one():
    names = ("whole", "budget")
    s = Selector("test", [make_sizer(n, worker=WORKER) for n in names], by_input=[False, True])
    for i in range(WARMUP + 20):
        s.observe(record("blind", 2000))
        s.observe(
            Record(TaskFeatures("sized", input_size=1e6 * (i + 1)), Resources(1, 2000, 100, 60))
        )
    assert s.shadows["blind"][1].score > s.shadows["blind"][0].score
    assert s.chosen("blind") is s.candidates[0]  # better by its score, but blind to inputs
    assert s.chosen("sized") is s.candidates[1]


def test_the_default_s_regressions_are_the_candidates_that_need_input_sizes():
    assert make_sizer("select", worker=WORKER).by_input == (False, True, True, False, False)


def _opposite(i: int, wall: float = 60.0) -> Record:
    """A task of a category whose memory and disk go opposite ways (bioblast's Split): much
    memory and little disk, or the other way round."""
    peak = Resources(1, 1300, 650, wall) if i % 2 else Resources(1, 5, 13000, wall)
    return Record(TaskFeatures("split"), peak)


def _opposite_selector(other_kills: int, tasks: int = 40, recorded: int = 40) -> Selector:
    """``select`` in a workflow of 4,000 tasks of another category and ``tasks`` of ``split``,
    ``other_kills`` of the other category's attempts killed, ``recorded`` of ``split``'s
    tasks recorded."""
    s = make_sizer("select", worker=WORKER)
    s.running.submit("many", 4000)
    s.running.submit("split", tasks)
    task = TaskFeatures("many")
    for _ in range(WARMUP):
        s.observe(Record(task, Resources(1, 2000, 100, 60)))
    for _ in range(other_kills):
        s.observe_exhaustion(task, Resources(1, 1000, 100), Exhaustion("memory", 1500))
    for i in range(recorded):
        s.observe(_opposite(i))
    return s


def test_bucketing_is_chosen_where_it_is_best_and_the_workflow_has_room_for_its_kills():
    """The lower buckets kill every task once, yet waste less than the upper quantile of both
    resources: beyond the category's own budget, within the workflow's."""
    s = _opposite_selector(other_kills=0)
    names = [c.name for c in s.candidates]
    shadows = dict(zip(names, s.shadows["split"], strict=True))
    assert shadows["greedy-det"].killed > 0.5 > BUDGET
    assert shadows["greedy-det"].awe > shadows["budget"].awe + 0.1
    assert s.chosen("split").name == "greedy-det"
    first = s.allocate(TaskFeatures("split"))
    assert first.memory < 1300 and first.disk < 13000  # each task starts in the lower buckets


def test_a_category_falls_back_to_its_own_budget_once_the_workflow_s_room_is_spent():
    room = round(WORKFLOW_BUDGET * 4040)  # the other category's kills take it all
    assert _opposite_selector(other_kills=room - 40).chosen("split").name == "greedy-det"
    s = _opposite_selector(other_kills=room)
    assert s.chosen("split").name == "budget"
    assert all(
        shadow.killed > BUDGET or c.name == "budget"
        for c, shadow in zip(s.candidates, s.shadows["split"], strict=True)
        if not s.by_input[s.candidates.index(c)]
    )


def test_the_workflow_s_room_is_shared_over_the_category_s_tasks_still_to_finish():
    """Of 80 tasks, 40 recorded: the 46 kills left in the room (7.5% of 4,080 tasks, 260
    spent) allow more than one per task still to come, as bucketing kills here, but not one
    per task of the category."""
    room = WORKFLOW_BUDGET * 4080
    s = _opposite_selector(other_kills=260, tasks=80)
    assert s.shadows["split"][3].killed == pytest.approx(1.0)
    assert (room - 260) / 80 < 1.0 < (room - 260) / 40
    assert s.chosen("split").name == "greedy-det"
    assert _opposite_selector(other_kills=280, tasks=80).chosen("split").name == "budget"


def test_records_of_an_earlier_run_are_not_tasks_of_this_one_s_room():
    earlier = _opposite_selector(other_kills=0)
    s = make_sizer("select", worker=WORKER)
    s.restore(earlier.state())  # 5 records of "many", 40 of "split"
    s.running.submit("split", 60)
    s.chosen("split")  # learns what is queued
    assert s._allowed("split") == pytest.approx(WORKFLOW_BUDGET)  # 4.5 kills over 60 tasks
    s.observe(_opposite(0))
    s.chosen("split")
    assert s._allowed("split") == pytest.approx(WORKFLOW_BUDGET * 60 / 59)


def test_bucketing_is_chosen_only_past_its_sampling_phase():
    """Before its 10th record, bucketing gives cctools' default, not what it learnt."""
    sampling = _opposite_selector(other_kills=0, recorded=SAMPLING - 1)
    assert sampling.chosen("split").name == "budget"
    bucketing = _opposite_selector(other_kills=0, recorded=SAMPLING)
    assert bucketing.chosen("split").name == "greedy-det"


def test_records_that_ran_no_time_score_candidates_until_one_that_ran_comes():
    shadow, budget = Shadow(), make_sizer("budget", worker=WORKER)
    for i in range(WARMUP):
        shadow.account(budget, _opposite(i, wall=0.0), budget)
        budget.observe(_opposite(i, wall=0.0))
    assert shadow.timed.awe is None
    untimed = shadow.untimed.awe
    assert untimed is not None and 0 < untimed < 1 and shadow.awe == untimed
    shadow.account(budget, _opposite(1), budget)
    assert shadow.timed.awe is not None and shadow.awe == shadow.timed.awe != untimed


def test_a_record_is_scored_with_what_its_candidate_gave_at_the_task_s_start():
    """The task started while only records of 2,000 MB had come: the quantile gave it about
    2,000 MB, and the 3,000 MB it used is a kill in the shadow, although by the time its
    record comes the quantile has learnt records of 4,000 MB and would give it enough."""
    s = selector()
    for _ in range(WARMUP + 20):
        s.observe(record("c", 2000))
    assert s.chosen("c") is s.candidates[1]
    started = TaskFeatures("c", key="s.0")
    assert s.allocate(started).memory < 3000
    for _ in range(20):
        s.observe(record("c", 4000))
    kills = s.shadows["c"][1].kills
    assert s.candidates[1].allocate(TaskFeatures("c")).memory > 3000
    s.observe(Record(started, Resources(1, 3000, 100, 60)))
    assert s.shadows["c"][1].kills == kills + 1
    for unseen in (TaskFeatures("c"), started):  # its start unseen, or its answers spent
        s.observe(Record(unseen, Resources(1, 3000, 100, 60)))
        assert s.shadows["c"][1].kills == kills + 1  # scored with what it would give now


def test_a_real_kill_counts_at_once_against_each_candidate_that_gave_no_more():
    s = selector()
    for _ in range(WARMUP + 20):
        s.observe(record("c", 2000, requested=2050))
    task = TaskFeatures("c", requested={"memory": 2050}, key="s.0")
    allocation = s.allocate(task)
    given = [candidate.allocate(task).memory for candidate in s.candidates]
    assert given[0] == WORKER.memory and given[2] == 2050 < given[1] == allocation.memory
    kills = [shadow.kills for shadow in s.shadows["c"]]
    s.observe_exhaustion(task, allocation, Exhaustion("memory", allocation.memory))
    after = [shadow.kills for shadow in s.shadows["c"]]
    assert after == [kills[0], kills[1] + 1, kills[2] + 1]  # the whole worker gave more
    s.observe(Record(task, Resources(1, 3000, 100, 60)))
    assert [shadow.kills for shadow in s.shadows["c"]] == after  # not counted twice


def _spied(monkeypatch: pytest.MonkeyPatch, s: Selector) -> tuple[dict, dict, list]:
    """Each candidate's latest first-attempt answer per task; per task, whether its category
    had its warm-up records when it started; what each record was scored with: (task,
    candidate, answer)."""
    given: dict[object, dict[int, Resources]] = {}
    warm: dict[object, bool] = {}
    scored: list[tuple[object, int, Resources | None]] = []
    for i, candidate in enumerate(s.candidates):

        def logged(task, previous=None, exhaustion=None, *, allocate=candidate.allocate, i=i):
            allocation = allocate(task, previous, exhaustion)
            if exhaustion is None:
                given.setdefault(task.key, {})[i] = allocation
            return allocation

        monkeypatch.setattr(candidate, "allocate", logged)

    def started(task, previous=None, exhaustion=None, *, allocate=s.allocate):
        if exhaustion is None:
            shadows = s.shadows.get(task.category)
            warm[task.key] = bool(shadows) and shadows[0].records >= WARMUP
        return allocate(task, previous, exhaustion)

    monkeypatch.setattr(s, "allocate", started)
    account = Shadow.account

    def spied(shadow, candidate, record, retrier, answer=None, counted=False):
        scored.append((record.task.key, s.candidates.index(candidate), answer))
        account(shadow, candidate, record, retrier, answer, counted)

    monkeypatch.setattr(Shadow, "account", spied)
    return given, warm, scored


def _scored_at_start(given: dict, warm: dict, scored: list) -> bool:
    """Whether every record of a task started after its category's warm-up was scored with
    what each candidate gave it then, and the others with what it gives when they come."""
    return all(
        answer == given[key][i] if warm[key] else answer is None for key, i, answer in scored
    )


def test_the_replay_scores_each_record_with_the_answers_at_its_task_s_start(monkeypatch):
    """Tasks whose memory grows with their place in the trace start many at once, before
    the records that score them: each is scored with what each candidate gave it then."""
    tasks = [TraceTask("c", Resources(1, 1000 + 50 * i, 100, 10 + 7 * i % 30)) for i in range(60)]
    s = make_sizer("select", worker=WORKER)
    assert isinstance(s, Selector)
    given, warm, scored = _spied(monkeypatch, s)
    out = replay(tasks, s, workers=2, worker=WORKER)
    assert out.completed == 60
    assert [shadow.records for shadow in s.shadows["c"]] == [60] * len(s.candidates)
    assert len(scored) == 60 * len(s.candidates)
    assert {key for key, _, _ in scored} == set(range(60))
    assert sum(warm.values()) > 30 and _scored_at_start(given, warm, scored)
    now = s.candidates[0].allocate(TaskFeatures("c")).memory
    assert sum(given[k][0].memory < now for k in warm if warm[k]) > 30  # it knew less then


def test_the_engine_tells_the_sizer_which_task_each_record_is(monkeypatch):
    workflow = loads(
        """
        name = "keyed"
        [[stage]]
        name = "s"
        allocation = { cores = 8, time = "10h" }
        tasks = { command = "true", count = 40, cores = 1 }
        [stage.simulate]
        duration = "normal(60, 10)"
        memory = "normal(300, 30)"
        disk = "normal(300, 10)"
        """
    )
    s = make_sizer("select", worker=Resources(8, 32000, 10_000))
    assert isinstance(s, Selector)
    given, warm, scored = _spied(monkeypatch, s)

    async def main():
        async with await Store.open(":memory:") as store:
            cluster = MockSlurm(ClusterSpec(nodes=2, cores_per_node=8, memory_per_node_mb=32000))
            workers = SimulatedWorkers(task_truths(workflow, seed=0))
            engine = Engine(workflow, cluster, store, planner=PerStage(), sizer=s, workers=workers)
            return await engine.run()

    assert clock.run(main(), virtual=True).status == "done"
    assert [shadow.records for shadow in s.shadows["s"]] == [40] * len(s.candidates)
    assert {key for key, _, _ in scored} == {f"s.{i}" for i in range(40)}
    assert sum(warm.values()) > 10 and _scored_at_start(given, warm, scored)


def test_a_disk_kill_far_below_the_peak_costs_the_shadow_the_early_kill_the_logs_show():
    """Disk fills during the run: an allocation a twentieth of the peak is killed at a median
    0.075 of the run, one near the peak at 0.528 (the calibrated table). Priced at the latter,
    a lower bucket's kill of a task writing 20 times more looked seven times as costly as it
    is (the Lobster trace's tasks write 24 MB or 400 MB). Memory is exceeded within seconds
    whatever the allocation: one price."""
    budget = make_sizer("budget", worker=WORKER)
    task = TaskFeatures("c")
    peak = Resources(1, 1000, 2000, 100)

    def charged(resource: str, given: float) -> float:
        answer = Resources(1, 1000, 2000).with_(resource, given)
        retry = budget.allocate(task, answer, Exhaustion(resource, given))
        shadow = Shadow()
        shadow.account(budget, Record(task, peak), budget, answer)
        return shadow.timed.allocated["cores"] / peak.wall - retry.cores

    assert kill_share("disk", 100, 2000) == pytest.approx(CALIBRATED.fraction["disk"][0][5])
    assert charged("disk", 100) == pytest.approx(0.075, abs=1e-3)
    assert charged("disk", 1900) == pytest.approx(0.528, abs=1e-3)
    assert charged("memory", 50) == charged("memory", 950) == pytest.approx(KILL_SHARE["memory"])
