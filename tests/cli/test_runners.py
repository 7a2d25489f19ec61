"""The in-process runner answers as the console script does ([Note: the two CLI runners] in tests/helpers/cli.py).

Most tests of arguments, errors, help and tables call ``run_cli`` (``rrfp_cli.app.main`` in the test's own
process) instead of starting ``python -m rrfp_cli``. This checks, on a sample of every kind of answer they rely
on (help, a group's help, tables at 200 and 80 columns, JSON, a usage error, user errors with and without
details, errors from a run's checks before any rank starts, one of them read from the environment), that the
two give the same exit code and the same stdout and stderr, byte for byte. The same for the repository's scripts
that tests run in this process (``run_script``). And for ``rrfp run`` in the warm server ([Note: the warm runner]
in tests/helpers/warm.py): a run, a run whose rank fails and a refused run answer alike, and leave the same files.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.cli import REPO, run_cli, run_rrfp, run_script
from tests.helpers.warm import run_warm

DEADLOCK = {"format": "rrfp-hint/1", "shape": {"ranks": 2, "chunks": 1, "microbatches": 2},
            "orders": [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]}

SAMPLE = {
    "help": (["--help"], 200),
    "group-alone": (["trace"], 200),
    "run-help-80": (["run", "--help"], 80),
    "hints-show": (["hints", "show", "1f1b", "-p", "4", "-m", "8"], 200),
    "simulate-compare-80": (["simulate", "-p", "4", "-m", "8", "--compare"], 80),
    "hints-json": (["hints", "show", "zb", "-p", "4", "-m", "8", "--json"], 200),
    "usage-error": (["simulate", "-p", "0"], 200),
    "deadlock-grid": (["hints", "check", "deadlock.json"], 200),
    "run-refused": (["run", "--stages", "2", "--hint", "nope", "--out", "x"], 200),
    "run-device": (["run", "--stages", "2", "--device", "cuda", "--out", "x"], 200),
    "trace-missing": (["trace", "summary", "missing"], 200),
    "run-environment": (["run", "--stages", "2", "--out", "x"], 200, {"RRFP_SOCKET_ADDR": "192.0.2.1"}),
}


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_in_process_and_subprocess_answer_alike(tmp_path, monkeypatch, name):
    args, columns, *env = SAMPLE[name]
    for variable, value in (env[0] if env else {}).items():
        monkeypatch.setenv(variable, value)
    answers = []
    for runner, where in ((run_rrfp, "subprocess"), (run_cli, "in-process")):
        cwd = tmp_path / where
        cwd.mkdir()
        (cwd / "deadlock.json").write_text(json.dumps(DEADLOCK))
        done = runner(cwd, *args, columns=columns)
        answers.append((done.returncode, done.stdout.replace(str(cwd), "CWD"), done.stderr.replace(str(cwd), "CWD")))
        assert sorted(p.name for p in cwd.iterdir()) == ["deadlock.json"]  # neither wrote anything
    subprocess_answer, in_process_answer = answers
    assert in_process_answer == subprocess_answer
    assert subprocess_answer[1] or subprocess_answer[2]  # it said something


SCRIPTS = {  # scripts of the repository that tests run in this process (tests.helpers.cli.run_script)
    "cost-table-bad-input": ("examples/cost_table.py", ["missing.jsonl", "--out", "c.csv"]),
    "cross-framework-bad-input": ("benchmarks/cross_framework.py", ["--cases", "uniform", "--iters", "1",
                                                                    "--stages", "2", "--microbatches", "1"]),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripts_in_process_and_subprocess_answer_alike(tmp_path, name):
    script, args = SCRIPTS[name]
    answers = []
    for where in ("subprocess", "in-process"):
        cwd = tmp_path / where
        cwd.mkdir()
        if where == "subprocess":
            done = run_rrfp(cwd, *args, module=(str(REPO / script),))
        else:
            done = run_script(cwd, script, *args)
        answers.append((done.returncode, done.stdout, done.stderr.replace(str(cwd), "CWD")))
        assert list(cwd.iterdir()) == []  # neither wrote anything
    assert answers[1] == answers[0] and answers[0][0] == 2


RUNS = {  # rrfp run as tests run it in the warm server
    "trains": ["run", "--workload", "tests.helpers.user_models:tiny", "-p", "2", "-m", "3", "--iters", "2", "--json"],
    "rank-fails": ["run", "--workload", "gpt", "-p", "2", "-m", "4", "--iters", "2", "--fail-at", "1F2@1", "--policy",
                   "fixed"],
    "refused": ["run", "-p", "2", "--hint", "nope"],
}
TIMED = ("seconds", "median_wall_seconds", "median_makespan_seconds", "median_throughput", "mean_idle_fraction",
         "metrics")  # measured: they differ from one run to the next however it is started


def _comparable(result, cwd) -> tuple:
    stdout = result.stdout
    if stdout.startswith("{"):
        data = json.loads(stdout)
        for job in data["jobs"]:
            job["losses"] = [row["loss"] for row in job["metrics"]]  # computed, not measured: bit for bit
            for key in TIMED:
                job.pop(key, None)
        stdout = json.dumps({k: v for k, v in data.items() if k not in TIMED})
    stderr = re.sub(r"t=\d+\.\d+", "t=T", result.stderr.replace(str(cwd), "CWD"))  # decision times
    stderr = re.sub(r"ready=\[[^]]*\]", "ready=[...]", stderr)  # what had arrived when: timing
    # Whether the failed rank's neighbours report too (the transport error the failure caused them) is a race
    # with the agent stopping them, however the run is started: a neighbour is either "also reported" or "was
    # stopped". Compare the culprit's report only.
    culprit = re.search(r"rank (\d+) in task", stderr)
    raced = re.compile(r"also reported: .*|ranks? [\d, ]+ (was|were) stopped")
    stderr = "\n".join(line for line in stderr.split("\n") if not raced.fullmatch(line))
    # Without a terminal rank 0 prints a line per iteration (runtime.run.progress) on its own stderr: a subprocess's
    # captured stderr, but under the warm runner the fork server's log (ranks fork from it, not from the command).
    # The step times and rates in them are measured anyway; the command's own lines are compared.
    stderr = re.sub(r"(?m)^[\w@.-]+: (\d+ iterations -> .*|iteration \d+  step .*)\n", "", stderr)
    files = sorted(re.sub(r"rrfp-\w+", "rrfp-ID", str(p.relative_to(cwd))) for p in cwd.rglob("*")
                   if not (p.parent.name == "failures" and culprit and not p.name.startswith(f"rank{culprit[1]}-")))
    return result.returncode, stdout, stderr, files


@pytest.mark.parametrize("name", sorted(RUNS))
def test_rrfp_run_warm_and_in_a_subprocess_answer_alike(tmp_path, name):
    answers = []
    for runner, where in ((run_rrfp, "subprocess"), (run_warm, "warm")):
        cwd = tmp_path / where
        cwd.mkdir()
        answers.append(_comparable(runner(cwd, *RUNS[name], "--out", "r"), cwd))
    assert answers[1] == answers[0]
    assert answers[0][0] == {"trains": 0, "rank-fails": 1, "refused": 2}[name]
    assert answers[0][1] or answers[0][2]  # it said something
