"""The command line on the simulated cluster: outputs, JSON keys, and clean errors."""

import json
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from backends import clock
from learners.sizing import DEFAULT_SIZER, SIZERS
from orchestrator.cli import app
from workflows.spec import example

BLAST = str(example("blast"))


def test_run_json_has_the_run_s_figures_and_each_stage_s(cli):
    done = cli("run", BLAST, "--json", "--strategy", "per-stage", "--scale", "28")
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output)
    assert summary["status"] == "done"
    assert {"makespan_s", "twt_s", "core_hours"} <= set(summary)
    assert [s["name"] for s in summary["stages"]] == ["search", "merge"]
    for stage in summary["stages"]:
        assert {"submit_s", "start_s", "end_s", "wait_s"} <= set(stage)
        assert stage["end_s"] >= stage["start_s"] >= stage["submit_s"]


def test_a_simulated_run_says_that_no_command_ran(cli):
    done = cli("run", BLAST, "--quiet", "--strategy", "bigjob")
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())  # as rich wrapped it
    assert (
        "a simulated run (--backend mock): a cluster replayed on virtual time, no task's "
        "command ran; --backend local or --backend slurm runs them"
    ) in said


def test_status_lists_the_runs_of_the_store(cli):
    cli("run", BLAST, "--quiet", "--strategy", "bigjob")
    listed = cli("status")
    assert listed.exit_code == 0
    assert "blast" in listed.output and "bigjob" in listed.output and "done" in listed.output


def test_status_lists_the_newest_runs_and_any_older_one_left_running(cli, tmp_path):
    """A store keeps every run: the list showed a hundred demo runs before the one asked for."""
    from orchestrator.cli import RECENT_RUNS
    from orchestrator.store import Store

    async def fill():
        async with await Store.open(tmp_path / "store.db") as store:
            for i in range(RECENT_RUNS + 5):
                gone = {"host": "elsewhere", "pid": 1, "started": 0.0} if i == 1 else None
                store.stage(
                    "runs", {"run_id": f"run{i:02d}"}, workflow="w", backend="mock",
                    strategy="asa", status="running" if i == 1 else "done",
                    created=1e9 + i, manager=gone, heartbeat=1e9 if gone else None,
                )  # fmt: skip
            await store.flush()

    clock.run(fill(), virtual=False)
    listed = cli("status").output
    shown = [f"run{i:02d}" for i in range(RECENT_RUNS + 5) if f"run{i:02d}" in listed]
    assert shown == ["run01", *[f"run{i:02d}" for i in range(5, RECENT_RUNS + 5)]]
    assert "manager gone" in listed.splitlines()[2]
    assert listed.splitlines()[0] == "4 earlier runs not listed (--all lists every run)"
    assert all(f"run{i:02d}" in cli("status", "--all").output for i in range(RECENT_RUNS + 5))
    assert len(json.loads(cli("status", "--json").output)) == RECENT_RUNS + 5


def test_compare_json_rows(cli):
    done = cli(
        "compare", BLAST, "--strategies", "per-stage,asa", "--scales", "28",
        "--runs", "1", "--load", "0.5", "--json", "--quiet",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    rows = json.loads(done.output)
    assert [r["strategy"] for r in rows] == ["per-stage", "asa"]
    keys = {"workflow", "scale", "strategy", "twt_s", "makespan_s", "core_hours", "pwt_s"}
    assert all(keys | {"oh_core_hours", "hit_ratio"} <= set(r) for r in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizer", "ksegments+nope"], "--sizer: unknown companion 'nope' of 'ksegments'"),
        (["--sizer", "greedy+exhaust"], "'greedy' sizes every resource"),
        (["--idle-cancel", "0"], "--idle-cancel 0: expected a positive duration"),
        (
            ["--idle-cancel", "5x"],
            "--idle-cancel: expected a duration such as 600 (seconds), 10m, 1h30m or 0:10:00, "
            "got '5x'",
        ),
        (["--backend", "local", "--manager-grace", "0"], "--manager-grace: 0 is not positive"),
        (["--trace", "HPC2N", "--offset", "-5m"], "--offset: '-5m' is negative"),
        (["--strategy", "fastest"], "fastest"),
        (["--wait-estimate", "1.5"], "--wait-estimate 1.5"),
        (["--queue-model", "fifo"], "unknown queue model 'fifo'; choose one of easy, site"),
        (["--scale", "0"], "Invalid value for '--scale': Input should be greater than or equal"),
    ],
)
def test_bad_options_are_one_line_errors_with_exit_code_2(cli, args, message):
    done = cli("run", BLAST, "--quiet", *args)
    assert done.exit_code == 2
    assert message in " ".join(done.output.split())
    assert "Traceback" not in done.output


def test_validate_names_the_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'name = "w"\n[[stage]]\nname = "a"\ntasks = { command = "true", count = 2 }\n'
        'allocation = { cores = "many" }\n'
    )
    done = CliRunner().invoke(app, ["validate", str(bad)])
    assert done.exit_code == 2
    text = "".join(done.output.split())  # rich wraps long lines
    assert f"{bad}:5:" in text and "stage.a.allocation.cores" in text


def test_validate_shows_each_stage_and_its_first_task_as_a_run_fills_it_in(tmp_path):
    (tmp_path / "data").mkdir()
    for name in ("b.txt", "a.txt", "c.txt"):
        (tmp_path / "data" / name).write_text("")
    path = tmp_path / "wf.toml"
    path.write_text(
        'name = "w"\n[[stage]]\nname = "sort"\nallocation = { cores = 2, time = "10m" }\n'
        "tasks = { command = \"sort {item} > s/{item.name}; echo '\\u001b[2J'\", "
        'items = { glob = "data/*.txt" }, outputs = ["s/{item.name}"], memory = "1G" }\n'
        '[[stage]]\nname = "cat"\nallocation = "auto"\n'
        'tasks = { command = "cat s/*.txt > {workdir}/all", count = 1 }\n'
    )
    done = CliRunner().invoke(app, ["validate", str(path), "--workdir", "/scratch/w"])
    assert done.exit_code == 0, done.output
    data = tmp_path / "data"
    assert done.output.splitlines() == [
        f"{path}: workflow w, 2 stages, 4 tasks: valid",
        "stage sort: 3 tasks on a pilot of 2 cores, 10 min; each task 1 GB",
        f"  sort.0  sort {data}/a.txt > s/a.txt; echo '\\x1b[2J'",
        "          outputs: s/a.txt",
        "  … 2 more (--tasks shows every task)",
        "stage cat, after sort: 1 task on an automatic pilot; each task sized by leadtime",
        "  cat.0  cat s/*.txt > /scratch/w/all",
    ]
    every = CliRunner().invoke(app, ["validate", str(path), "--tasks"]).output.splitlines()
    assert [line.split()[0] for line in every[2:8:2]] == ["sort.0", "sort.1", "sort.2"]
    assert every[6:8] == [f"  sort.2  sort {data}/c.txt > s/c.txt; echo '\\x1b[2J'",
                          "          outputs: s/c.txt"]  # fmt: skip


def test_a_directory_placeholder_in_quotes_over_a_path_that_needs_them_is_refused(tmp_path):
    """In quotes, the quotes leadtime puts around ``/tmp/my dir`` would be read as part of the
    path: refused by validate and by run, before anything starts, for a directory that needs
    them; the same file is fine where it does not."""
    workdir = tmp_path / "my dir"
    workdir.mkdir()
    path = tmp_path / "wf.toml"
    path.write_text(
        'name = "w"\n[[stage]]\nname = "a"\nallocation = { cores = 1, time = "10m" }\n'
        "tasks = { command = 'cd \"{workdir}\" && touch x{index}', count = 2 }\n"
    )
    message = (
        f"{path}:5: stage.a.tasks.command: {{workdir}} is inside shell quotes, where the quotes "
        f"leadtime puts around '{workdir}' would be read as part of it: write the placeholder "
        "outside the quotes (leadtime quotes each value it fills in)"
    )
    for command in (["validate"], ["run", "--backend", "local", "--db", str(tmp_path / "db")]):
        done = CliRunner().invoke(app, [*command, str(path), "--workdir", str(workdir)])
        assert done.exit_code == 2, done.output
        assert " ".join(done.output.split()) == f"error: {message}"
    assert list(workdir.iterdir()) == []  # nothing ran, not even the run's own directory
    done = CliRunner().invoke(app, ["validate", str(path), "--workdir", "/scratch/w"])
    assert done.exit_code == 0, done.output


def test_the_queue_model_reaches_the_replay(cli, tmp_path):
    """The same offset of HPC2N under the easy and the site model: the pilots meet another
    queue."""
    waits = {}
    for model in ("easy", "site"):
        done = cli(
            "run", BLAST, "--trace", "HPC2N", "--offset", "67500401", "--strategy", "per-stage",
            "--queue-model", model, "--json", "--db", str(tmp_path / model),
        )  # fmt: skip
        assert done.exit_code == 0, done.output
        waits[model] = json.loads(done.output)["twt_s"]
    assert waits["site"] != waits["easy"]


def test_the_trace_offset_is_a_duration(cli, tmp_path):
    """Given as people write durations, or in seconds: the same moment of the log."""
    flags = ("--trace", "HPC2N", "--strategy", "per-stage", "--json")
    runs = [
        cli("run", BLAST, *flags, "--offset", offset, "--db", str(tmp_path / f"{i}.db"))
        for i, offset in enumerate(("67500401", "781d 6h 6m 41s"))
    ]
    assert all(done.exit_code == 0 for done in runs), runs[-1].output
    first, second = (json.loads(done.output) for done in runs)
    assert first["twt_s"] == second["twt_s"] and first["makespan_s"] == second["makespan_s"]


def test_the_command_line_collects_the_youngest_objects_less_often(monkeypatch):
    """A manager holds every task of its run: Python's default threshold (700 allocations)
    had a 100,000-task run spend a tenth of its time in the collector."""
    import gc

    from orchestrator.session import YOUNG_COLLECTION

    before = gc.get_threshold()
    monkeypatch.setattr("sys.argv", ["leadtime", "--version"])
    try:
        gc.set_threshold(700, *before[1:])
        with pytest.raises(SystemExit):
            _console_script()()
        assert gc.get_threshold() == (YOUNG_COLLECTION, *before[1:])
    finally:
        gc.set_threshold(*before)


def _console_script():
    """The function the installed ``leadtime`` command calls."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="leadtime")
    return script.load()


@pytest.mark.parametrize("after", [0.05, 0.3])
def test_ctrl_c_while_the_command_line_loads_leaves_quietly(after):
    """Its imports take about a second: a Ctrl-C then printed a traceback from one of them.

    ``after`` counts from the moment the process reaches the console script's import (it says
    so on stdout): before, the interpreter is still starting, and a Ctrl-C is Python's (on a
    loaded machine its start alone outlasted 0.05 s)."""
    script = _console_script()
    code = f"print('go', flush=True); from {script.__module__} import main; main()"
    command = [sys.executable, "-c", code, "status"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None and run.stdout.readline() == "go\n"
        time.sleep(after)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, err
    assert (out, err) == ("", "")


_CTRL_C_INSIDE_A_WEAKREF_CALLBACK = """
import os, signal, sys, weakref

class Finder:  # the first import of the command line: Ctrl-C arrives in a weakref callback
    def find_spec(self, name, path, target=None):
        if name == "orchestrator.cli":
            sys.meta_path.remove(self)
            obj = type("Obj", (), {})()
            ref = weakref.ref(obj, lambda _: os.kill(os.getpid(), signal.SIGINT))
            del obj
        return None

sys.meta_path.insert(0, Finder())
"""

_CTRL_C_WHILE_TYPER_BUILDS = """
import os, signal, typer.main

build = typer.main.get_command

def get_command(app):
    os.kill(os.getpid(), signal.SIGINT)
    return build(app)

typer.main.get_command = get_command
"""


@pytest.mark.parametrize(
    "when",
    [_CTRL_C_INSIDE_A_WEAKREF_CALLBACK, _CTRL_C_WHILE_TYPER_BUILDS],
    ids=["weakref", "typer"],
)
def test_ctrl_c_at_the_worst_moments_of_loading_leaves_quietly(when):
    """Two moments a timed Ctrl-C hits only now and then, made certain: inside a weakref
    callback of the import machinery (an exception raised there was printed as ignored, and
    the command ran on to exit 0), and while typer builds the commands after the imports."""
    code = f"{when}\nfrom {_console_script().__module__} import main; main()"
    run = subprocess.run(
        [sys.executable, "-c", code, "status"], capture_output=True, text=True, timeout=60
    )
    assert (run.returncode, run.stdout, run.stderr) == (130, "", "")


def test_ctrl_c_in_a_simulated_run_says_to_run_it_again_not_to_resume(tmp_path):
    """A simulated cluster lives in its manager: nothing is left to release or resume."""
    (tmp_path / "wf.toml").write_text(
        'name = "big"\n[[stage]]\nname = "a"\nallocation = { cores = 64, time = "10h" }\n'
        'tasks = { command = "x", count = 500000, cores = 1 }\n'
        'simulate = { duration = "constant(5)", memory = 100 }\n'
    )
    command = [sys.executable, "-c", "from orchestrator.cli import main; main()", "run"]
    command += [str(tmp_path / "wf.toml"), "--backend", "mock", "--db", str(tmp_path / "db")]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # well into the run, far from its end
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, err
    assert "interrupted: the simulated cluster lived in it; run it again" in err, err
    assert "resume" not in err and "Traceback" not in err


def test_sizers_lists_every_sizer_the_default_and_the_smallest_limit():
    done = CliRunner().invoke(app, ["sizers"], terminal_width=200)
    assert done.exit_code == 0
    names = [line.split(":")[0].split(" (")[0] for line in done.output.splitlines()]
    assert set(SIZERS) <= set(names)
    assert f"{DEFAULT_SIZER} (default" in done.output
    assert "None gives less than 64 MB of memory or disk unless a task declares it." in done.output
