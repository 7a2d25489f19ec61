"""tune-hint's two budgets ([Note: two budgets] in runtime/tune/search.py): ``--time-budget`` is wall-clock time
whatever the machine's speed, ``--evaluations`` a work budget that gives the same search on every machine and
reproduces a timed one, both together whichever ends first; report.json records which stopped the search, its
wall and CPU time and its simulations per second per worker. Worker processes (``--jobs 2``) and signals:
tests/cli/test_tune_workers.py."""

from __future__ import annotations

import json
import shlex
import time

import pytest

from hints.tasks import PipelineShape
from runtime.durations.variability import VariabilityModel
from runtime.sched.budget import MemoryBudget
from runtime.tune.decide import tune
from runtime.tune.evaluator import Candidate, Evaluator, Objective
from runtime.tune.scenarios import from_model
from runtime.tune.search import Search, SearchConfig
from tests.helpers.cli import one_error_line, run_cli

MEAN = Objective.parse("mean")
MODEL = ("--workload", "multimodal", "-p", "4", "-m", "8", "--jitter", "0.1", "--scenarios", "6")


def _scenarios():
    return from_model(VariabilityModel(workload="multimodal", jitter=0.1), PipelineShape(4, 1, 8), 6, 6, seed=1)


def _slower(monkeypatch, seconds: float) -> None:
    """Every simulation takes ``seconds`` longer: a machine far slower than the one a budget was calibrated on
    (asleep, so a busy machine running the test does not change what it shows)."""
    simulate = Evaluator.simulate

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return simulate(self, *args, **kwargs)

    monkeypatch.setattr(Evaluator, "simulate", slow)


def _search(outcome) -> list:
    """What a search found, in order: every fully scored candidate with its value, and the best-so-far trace."""
    return [(s.candidate.name, s.candidate.rule, s.value) for s in outcome.search.scored], outcome.search.trace


def test_a_time_budget_is_wall_clock_time_on_a_slow_machine(monkeypatch):
    # 2 ms more per simulation: the budget's old nominal work (3,906 simulations for 1.5 s) took over 8 s here.
    _slower(monkeypatch, 0.002)
    began = time.monotonic()
    outcome = tune(_scenarios(), "ready", "1f1b", MEAN, time_budget=1.5, seed=0)
    wall = time.monotonic() - began
    assert outcome.search.stopped == "time budget"
    assert 1.5 * 0.75 <= wall <= 1.5 + 1.0, wall  # the verdict and the report's simulations inside it
    assert outcome.verdict.chosen in outcome.search.scored  # the best found so far, judged on held-out scenarios


def test_a_search_cut_by_the_clock_is_reproduced_by_its_evaluations():
    scenarios = _scenarios()
    timed = tune(scenarios, "ready", "1f1b", MEAN, time_budget=1.0, seed=3)
    assert timed.search.stopped == "time budget" and timed.search.simulations > 0
    again = tune(scenarios, "ready", "1f1b", MEAN, evaluations=timed.search.simulations, seed=3)
    assert again.search.stopped == "evaluations" and again.search.simulations == timed.search.simulations
    assert _search(again) == _search(timed)
    assert again.verdict.chosen.candidate.name == timed.verdict.chosen.candidate.name


def test_both_budgets_stop_the_search_whichever_ends_first():
    scenarios = _scenarios()
    began = time.monotonic()
    by_work = tune(scenarios, "ready", "1f1b", MEAN, time_budget=600.0, evaluations=400)
    assert by_work.search.stopped == "evaluations" and by_work.search.simulations <= 400
    assert time.monotonic() - began < 60
    by_clock = tune(scenarios, "ready", "1f1b", MEAN, time_budget=0.5, evaluations=10**9)
    assert by_clock.search.stopped == "time budget" and by_clock.search.simulations < 10**9


def test_the_references_are_scored_whatever_the_budget():
    # One evaluation cannot score anything in full but fixed 1F1B, which every verdict compares with: it is
    # scored on every tuning scenario anyway, and it is what is written out.
    outcome = tune(_scenarios(), "ready", "1f1b", MEAN, evaluations=1)
    assert outcome.search.stopped == "evaluations" and outcome.search.simulations == 6
    assert [s.candidate.family for s in outcome.search.scored] == ["baseline"]
    assert outcome.verdict.chosen.candidate.family == "baseline"
    # and the verdict says why: nothing else was compared (not "the best candidate is ... itself")
    assert outcome.verdict.reason.startswith("the evaluations ended the search before any candidate but 1f1b")


def test_report_records_the_budgets_the_effort_and_the_command_that_reproduces_it(tmp_path):
    done = run_cli(tmp_path, "tune-hint", *MODEL, "--time-budget", "1s", "--out", "timed", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    search = data["search"]
    assert search["stopped"] == "time budget" and search["budgets"] == {"time_budget_s": 1.0, "evaluations": None}
    assert 0.75 <= search["wall_s"] <= 2.0 and search["search_wall_s"] <= search["wall_s"]
    assert search["cpu_s"] > 0 and search["cpu_s"] == pytest.approx(search["cpu_s_main"] + search["cpu_s_workers"])
    assert search["jobs"] == 1 and search["simulations"] == search["reproduce_with_evaluations"] > 0
    assert search["simulations_per_second_per_worker"] == pytest.approx(search["simulations"] /
                                                                        search["search_wall_s"])
    report = (tmp_path / "timed" / "report.md").read_text()
    assert f"--evaluations {search['simulations']} with the same seed and --jobs" in report
    command = data["commands"]["the same search on any machine"]
    assert "--time-budget" not in command and command.endswith(f"--evaluations {search['simulations']}")
    args = shlex.split(command)[1:]
    args[args.index("--out") + 1] = "again"
    again = json.loads(run_cli(tmp_path, *args).stdout)
    assert again["search"]["stopped"] == "evaluations"
    assert again["search"]["budgets"] == {"time_budget_s": None, "evaluations": search["simulations"]}
    for key in ("simulations", "trace", "candidates_scored"):
        assert again["search"][key] == search[key], key
    assert again["verdict"] == data["verdict"] and again["rows"] == data["rows"]


def test_evaluations_must_be_a_positive_count(tmp_path):
    for value in ("0", "-3"):
        line = one_error_line(run_cli(tmp_path, "tune-hint", *MODEL, "--evaluations", value, "--out", "x"))
        assert line.startswith("error: --evaluations: must be at least 1"), line
    assert not (tmp_path / "x").exists()


def test_an_error_in_a_worker_is_one_line_and_every_worker_ends_quietly(tmp_path, monkeypatch, capfd):
    def broken(self, *args, **kwargs):
        raise ValueError("a simulation went wrong")

    monkeypatch.setattr(Evaluator, "makespans", broken)  # the forked workers inherit it
    done = run_cli(tmp_path, "tune-hint", *MODEL, "--jobs", "2", "--evaluations", "500", "--out", "x")
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "internal error: ValueError: a simulation went wrong (rerun with RRFP_DEBUG=1 for a traceback)"], done.stderr
    assert "Traceback" not in capfd.readouterr().err  # what the workers wrote to the process's own stderr
    assert not (tmp_path / "x").exists()


def _more_scenarios():
    """Ten tuning scenarios: the race scores a newcomer on the first six, the best quarter on the other four."""
    return from_model(VariabilityModel(workload="multimodal", jitter=0.1), PipelineShape(4, 1, 8), 10, 4, seed=1)


def test_a_budget_that_cuts_the_race_still_scores_its_leader_in_full():
    # [Note: a race the budget cut]: fixed 1F1B (10), one newcomer on the first six, and the room kept for the
    # leader's other four. Before, such a budget left only fixed 1F1B scored in full: it was what was written out.
    outcome = tune(_more_scenarios(), "ready", "1f1b", MEAN, evaluations=10 + 6 + 4)
    assert outcome.search.stopped == "evaluations" and outcome.search.simulations == 20
    families = {s.candidate.family: s for s in outcome.search.scored}
    assert set(families) == {"baseline", "built-in"} and len(families["built-in"].makespans) == 10
    assert outcome.search.raced == 2 and outcome.search.candidates > 2  # fixed 1F1B and one newcomer
    assert "before any candidate" not in outcome.verdict.reason  # the verdict compared the two
    # one simulation less: no room for a newcomer and its leader's rest, so nothing is raced
    less = tune(_more_scenarios(), "ready", "1f1b", MEAN, evaluations=19)
    assert less.search.simulations == 10 and [s.candidate.family for s in less.search.scored] == ["baseline"]


def test_a_race_cut_by_the_clock_is_reproduced_by_its_evaluations(monkeypatch):
    _slower(monkeypatch, 0.03)  # the race is cut a few candidates in, on any machine
    scenarios = _more_scenarios()
    timed = tune(scenarios, "ready", "1f1b", MEAN, time_budget=1.5, seed=2)
    assert timed.search.stopped == "time budget"
    scored = {s.candidate.family for s in timed.search.scored}
    assert scored == {"baseline", "built-in"}, scored  # cut in the first race, its leader scored in full
    again = tune(scenarios, "ready", "1f1b", MEAN, evaluations=timed.search.simulations, seed=2)
    assert again.search.stopped == "evaluations" and again.search.simulations == timed.search.simulations
    assert _search(again) == _search(timed)


def test_the_report_says_how_far_the_race_got(tmp_path):
    done = run_cli(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8", "--jitter", "0.1",
                   "--scenarios", "10", "--evaluations", "20", "--out", "cut", "--json")
    assert done.returncode == 0, done.stderr
    search = json.loads(done.stdout)["search"]
    assert search["candidates_raced"] == 2 and search["candidates"] > 2 and search["candidates_scored"] == 2
    report = (tmp_path / "cut" / "report.md").read_text()
    assert (f"The first race got through 2 of the portfolio's {search['candidates']} candidates before it "
            "stopped; a larger budget races the rest.") in report


def test_the_built_ins_computed_from_each_scenarios_task_graph_race_last(monkeypatch):
    # [Note: a race the budget cut]: cp (about ten simulations' time a scenario on a large shape) and the planned
    # order (planned from cp) are raced after every other candidate, so a budget that cannot afford them ends the
    # race there and not before the rest
    first: list[tuple[str, str]] = []
    simulate = Evaluator.simulate

    def recording(self, candidate, which, index, record=False):
        if which == "tuning" and (candidate.name, candidate.rule) not in first:
            first.append((candidate.name, candidate.rule))
        return simulate(self, candidate, which, index, record)

    monkeypatch.setattr(Evaluator, "simulate", recording)
    outcome = tune(_more_scenarios(), "ready", "1f1b", MEAN, evaluations=100_000)
    raced = first[:outcome.search.raced]  # the references, then the race in its order
    last = {"cp", "planned"}
    tail = len(raced) - next(k for k in range(len(raced), 0, -1) if raced[k - 1][0] not in last)
    assert {name for name, _ in raced[-tail:]} == last
    assert all(name not in last for name, _ in raced[:-tail])


def _clock(reserve_each: int = 10) -> Search:
    evaluator = Evaluator(_scenarios(), MemoryBudget.parse("1f1b"), 0.0)
    search = Search(evaluator, SearchConfig(MEAN, ("lookahead",), seconds=100.0, started=time.monotonic(),
                                            reserve_each=reserve_each))
    search._sim_seconds, search._sims_timed = 0.01, 1  # a mean simulation: 10 ms
    return search


CP = Candidate("cp", "built-in", "lookahead", builtin="cp")


def test_the_clock_keeps_back_the_hold_out_of_each_family_the_second_race_may_add():
    # cp, always scored in full by the second race as the best built-in, used to be priced only once that race was
    # done: at 32 x 128, 25 s of held-out simulations the clock had not kept back (an 80 s budget ran 104 s)
    search = _clock()
    search._rates[("built", "cp")] = 0.5
    before = search.time_left()
    search._second_race([CP])
    assert before - search.time_left() == pytest.approx(10 * 0.5, abs=0.05)  # ten held-out scenarios at 0.5 s


def test_an_unraced_built_in_is_priced_at_twice_its_build_and_its_rate_counts_the_build_reused(monkeypatch):
    search = _clock()
    monkeypatch.setattr(search.evaluator, "hint_for", lambda candidate, which, index: time.sleep(0.05))
    search._price_builds([CP])
    assert search._prebuilt[("built", "cp")] == pytest.approx(0.05, abs=0.005)
    built = search._prebuilt[("built", "cp")]
    # before its job starts, the clock keeps room for it to lead: ten held-out scenarios at twice that build
    assert search.time_left() - search.time_left(CP) == pytest.approx(10 * 2 * built, abs=0.01)
    search._job_timed(CP, 1.0, 6)  # six scenarios, the first built before the race: 1.05 s of work, not 1.0
    assert search._rates[("built", "cp")] == pytest.approx((1.0 + built) / 6)
    search._job_timed(CP, 0.3, 6)  # the same built-in under another rule, its builds reused: the slower rate stays
    assert search._rates[("built", "cp")] == pytest.approx((1.0 + built) / 6)
