"""What a new user meets first: --version, -h, shell completion, words in help, human
durations, output that reads well off a terminal, and examples that run on every built-in log."""

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.human import duration
from workflows.spec import example

LEADTIME = [sys.executable, "-m", "orchestrator.cli"]
COMMANDS = [
    [],
    ["run"],
    ["validate"],
    ["demo"],
    ["status"],
    ["report"],
    ["logs"],
    ["compare"],
    ["worker"],
    ["sizers"],
    ["bench", "sizing"],
    ["learner", "show"],
]


def test_version():
    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0
    assert done.output.strip() == f"leadtime {version('leadtime')}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "leadtime")
def test_h_is_help_and_values_read_as_words(command):
    short = CliRunner().invoke(app, [*command, "-h"], terminal_width=100)
    long = CliRunner().invoke(app, [*command, "--help"], terminal_width=100)
    assert short.exit_code == long.exit_code == 0
    assert short.output == long.output
    assert "Usage:" in short.output
    assert not re.search(r"<\w+(\[\w+\])?>", short.output), short.output


def test_bench_sizing_by_default_sets_the_default_sizer_beside_the_declared_sizes(tmp_path):
    from learners.sizing import DEFAULT_SIZER

    trace = tmp_path / "t.csv"
    rows = [f"a,1,{100 + 10 * i},50,{20 + i},{30 + i}" for i in range(30)]
    trace.write_text("category,cores,memory,disk,cpu_time,wall_time\n" + "\n".join(rows) + "\n")
    done = CliRunner().invoke(app, ["bench", "sizing", "--trace", str(trace), "--json"])
    assert done.exit_code == 0, done.output
    assert [r["sizer"] for r in json.loads(done.output)] == [DEFAULT_SIZER] * 3 + ["user"] * 3


def test_run_help_lists_its_flags_by_what_they_tune_and_a_backend_s_under_its_name():
    text = CliRunner().invoke(app, ["run", "-h"], terminal_width=200).output
    panels: dict[str, list[str]] = {}
    for line in text.splitlines():
        if title := re.match(r"╭─ (.+?) ─", line):
            flags = panels.setdefault(title[1], [])
        elif flag := re.match(r"│ (--[\w-]+)", line):
            flags.append(flag[1])
    assert {"--backend", "--sizer", "--workdir", "--json"} <= set(panels["Options"])
    assert {"--strategy", "--cost", "--unit", "--share"} <= set(panels["Strategy"])
    assert {"--policy", "--wait-estimate"} <= set(panels["Queue-wait learner"])
    assert {"--trace", "--cluster"} <= set(panels["Options of --backend mock"])
    assert panels["Options of --backend slurm"] == ["--sbatch-option"]
    assert "--keep-sandboxes" in panels["Options of --backend local and slurm"]


def test_run_help_shows_flags_bare_and_values_by_their_kind():
    text = CliRunner().invoke(app, ["run", "-h"], terminal_width=200).output
    share = next(line for line in text.splitlines() if "--share" in line)
    assert "--no-share" in share and "BOOL" not in share.upper().replace("BOOLEAN", "")
    assert re.search(r"--seed\s+INTEGER", text)
    assert re.search(r"--idle-cancel\s+DURATION", text)  # 10m, 1h30m, 0:10:00 or seconds
    assert re.search(r"--db\s+PATH", text)


def test_shell_completion_installs_and_completes(tmp_path):
    # The shell is named, not detected from the processes above the test (typer's switch).
    env = {**os.environ, "HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    done = subprocess.run(
        [*LEADTIME, "--install-completion", "bash"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "completion installed" in done.stdout
    assert (tmp_path / ".bashrc").read_text().count("leadtime") >= 1
    env |= {"_LEADTIME_COMPLETE": "complete_bash", "COMP_WORDS": "leadtime run --stra"}
    env |= {"COMP_CWORD": "2"}
    script = [sys.executable, "-c", "from orchestrator.cli import app; app(prog_name='leadtime')"]
    completed = subprocess.run(script, env=env, capture_output=True, text=True, check=False)
    assert completed.stdout.split() == ["--strategy"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0 s"),
        (0.4, "0.4 s"),
        (45, "45 s"),
        (59.6, "1 min"),
        (200, "3 min 20 s"),
        (3600, "1 h"),
        (8460, "2 h 21 min"),
        (86399, "1 d"),
        (90000, "1 d 1 h"),
        (8_484_813, "98 d 5 h"),
        (-75, "-1 min 15 s"),
    ],
)
def test_durations_read_as_people_write_them(seconds, text):
    assert duration(seconds) == text


def test_json_keeps_seconds_where_tables_show_durations(tmp_path):
    args = ["run", str(example("blast")), "--strategy", "per-stage", "--db", str(tmp_path / "s")]
    table = CliRunner().invoke(app, [*args, "--quiet"]).output
    figures = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    assert isinstance(figures["makespan_s"], float)
    assert f"makespan {duration(figures['makespan_s'])}" in " ".join(table.split())


def test_a_run_s_figures_are_one_line_under_its_table(tmp_path):
    """Wider than the table: a caption would fold them at its width."""
    args = ["run", str(example("blast")), "--strategy", "asa", "--db", str(tmp_path / "s")]
    table = CliRunner().invoke(app, [*args, "--quiet"]).output
    (line,) = [line for line in table.splitlines() if line.startswith("makespan ")]
    assert re.fullmatch(r"makespan .+ · TWT .+ · OH [\d.]+ core-hours · hit ratio \d+%", line)


def test_off_a_terminal_decisions_are_a_log_apart_from_the_summary(tmp_path):
    """Piped output: each decision once, on its own line, and the summary after a blank line."""
    demo = ["run", str(example("demo")), "--trace", "HPC2N", "--offset", "67500401"]
    done = subprocess.run(
        [*LEADTIME, *demo, "--db", str(tmp_path / "store.db")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    log, _, summary = done.stdout.partition("\n\n")
    decisions = log.splitlines()
    assert decisions and all(line.startswith("t+") for line in decisions)
    assert len({line.split("  ", 1)[1] for line in decisions}) == len(decisions)
    assert summary.startswith("demo · elastic · done")
    assert "\x1b" not in done.stdout


@pytest.mark.parametrize("trace", ["HPC2N", "KTH", "CTC"])
@pytest.mark.parametrize("name", ["montage", "blast", "statistics", "demo"])
def test_every_example_runs_on_every_built_in_log(tmp_path, name, trace):
    done = CliRunner().invoke(
        app, ["run", str(example(name)), "--trace", trace, "--json", "--db", str(tmp_path / "s")]
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["status"] == "done"


@pytest.mark.parametrize("strategy", ["elastic", "asa"])
def test_a_stage_that_fits_no_node_is_refused_before_anything_runs(tmp_path, strategy):
    """Whatever the strategy: elastic never submits a stage's allocation whole, but a file
    whose allocation the cluster could never give is refused all the same."""
    store = tmp_path / "store.db"
    montage = ["run", str(example("montage")), "--trace", "KTH", "--cluster", "4x28:8G"]
    done = CliRunner().invoke(app, [*montage, "--db", str(store), "--strategy", strategy])
    assert done.exit_code == 2
    message = " ".join(done.output.split())
    assert (
        "montage.toml:26: stage.project.allocation.memory: the batch system refused a pilot of "
        "28 cores" in message
    )
    assert "does not fit nodes of 8000 MB and 28 cores" in message
    assert "nothing was submitted" in message
    assert not store.exists()  # a refused run leaves no store behind


def _commands(group):
    yield from group.registered_commands
    for sub in group.registered_groups:
        yield from _commands(sub.typer_instance)


def test_a_commands_help_is_prose_not_the_docstrings_line_breaks():
    """Rich help keeps single line breaks: the list of commands broke mid-sentence where the
    docstring's lines ended ('one big job, a pilot' / 'per stage')."""
    helps = {c.callback.__name__: c.help for c in _commands(app)}
    assert len(helps) >= 12 and all(helps.values())
    for name, text in helps.items():
        assert all("\n" not in paragraph for paragraph in text.split("\n\n")), name
    listed = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    assert "one big job, a pilot per stage, ASA and elastic side by side" in listed
