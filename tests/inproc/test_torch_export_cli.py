"""rrfp hints export --torch-csv and rrfp tune-hint --target torch in this process: only CSVs torch can run are
written ([Note: a CSV torch can run] in hints/files/torch_csv.py), orders that depend on each iteration's costs
need --freeze-iteration, and tune-hint's torch outputs load back into the order they came from."""

from __future__ import annotations

import json

import pytest

from hints.errors import HintError
from hints.files.hint_json import save_hint
from hints.files.load import load_hint
from hints.files.torch_csv import check_runs_in_torch, in_torch_loss_order, last_stage_forwards
from hints.orders import HintOrder, applicable_builtins, as_cost_ranked, builtin_hint, relabelled
from hints.tasks import PipelineShape, Task
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.evaluate import concrete, resolve
from runtime.sched.simulator import check_completes
from tests.helpers.cli import one_error_line, run_cli

pytestmark = pytest.mark.inproc

TUNE = ("--time-budget", "1s", "--scenarios", "4")


def _malformed(ranked: bool) -> HintOrder:
    """The issue's hint: GPipe heaviest first whose rank 2 runs 2B5 before 2F7, which rank 3 needs for 3B5."""
    gpipe = builtin_hint("gpipe", 4, 1, 8)
    rank2 = tuple(Task.parse(t) for t in ["2F0", "2F1", "2F2", "2F3", "2F4", "2F5", "2F6", "2B5", "2F7",
                                          "2B0", "2B1", "2B2", "2B3", "2B4", "2B6", "2B7"])
    hint = HintOrder(gpipe.shape, (*gpipe.orders[:2], rank2, gpipe.orders[3]), "gpipe heaviest first + local search")
    return as_cost_ranked(hint, [8.0 - k for k in range(8)]) if ranked else hint


def _files(directory):
    return sorted(p.name for p in directory.iterdir())


def test_the_malformed_hint_is_refused_with_exit_2_and_nothing_written(tmp_path):
    save_hint(_malformed(ranked=False), tmp_path / "bad.json")
    line = one_error_line(run_cli(tmp_path, "hints", "export", "bad.json", "--torch-csv", "s.csv", "--out", "o.json"))
    assert line.startswith("error: hint gpipe heaviest first + local search: torch runs a CSV in exactly its order, "
                           "and this order cannot complete under the fixed policy")
    assert "first: rank 0 waits at step 8 for 0B0" in line and line.endswith("nothing written (rrfp hints check draws "
                                                                              "where each rank waits)")
    assert _files(tmp_path) == ["bad.json"]  # neither the CSV nor the JSON, no temporary file


def test_the_issues_cost_ranked_hint_needs_freezing_and_is_still_refused_frozen(tmp_path):
    save_hint(_malformed(ranked=True), tmp_path / "hint.json")
    line = one_error_line(run_cli(tmp_path, "hints", "export", "hint.json", "--torch-csv", "s.csv"))
    assert line.startswith("error: --torch-csv: gpipe heaviest first + local search is cost-ranked (rrfp-hint/2)")
    assert "pass --freeze-iteration N" in line
    line = one_error_line(run_cli(tmp_path, "hints", "export", "hint.json", "--torch-csv", "s.csv",
                                  "--freeze-iteration", "1", "--workload", "multimodal"))
    assert "cannot complete under the fixed policy" in line  # bound to an iteration, it still cannot run in torch
    assert _files(tmp_path) == ["hint.json"]


BUILTINS = [(name, chunks) for chunks in (1, 2) for name in [*applicable_builtins(4, chunks, 8), "cp"]] + [("zbv", 2)]


@pytest.mark.parametrize("name, chunks", BUILTINS, ids=[f"{name}-v{chunks}" for name, chunks in BUILTINS])
def test_every_builtin_exports_for_torch_and_passes_its_lowering(tmp_path, name, chunks):
    result = run_cli(tmp_path, "hints", "export", name, "-p", "4", "-m", "8", "-v", str(chunks), "--torch-csv", "s.csv",
                     "--freeze-iteration", "0", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["torch_checks"]["completes_in_fixed_order"] is True
    assert data["torch_checks"]["torch_lowering"]  # torch is installed here: its own lowering accepted the CSV
    hint = resolve(name, 4, chunks, 8, model=VariabilityModel())
    assert load_hint(tmp_path / "s.csv", hint.shape.placement).orders == hint.orders


@pytest.mark.parametrize("name", ["bfw", "cp", "1f1b-light", "1f1b-heavy"])
def test_a_builtin_built_from_costs_needs_freeze_iteration(tmp_path, name):
    line = one_error_line(run_cli(tmp_path, "hints", "export", name, "-p", "4", "-m", "8", "--torch-csv", "s.csv"))
    assert line.startswith(f"error: --torch-csv: {name} ") and "--freeze-iteration N" in line
    assert _files(tmp_path) == []


def test_freeze_iteration_binds_that_iterations_costs_and_warns(tmp_path):
    result = run_cli(tmp_path, "hints", "export", "bfw", "-p", "4", "-m", "8", "--workload", "multimodal",
                     "--torch-csv", "s.csv", "--freeze-iteration", "3")
    assert result.returncode == 0, result.stderr
    warning = " ".join(result.stderr.split())
    assert warning.startswith("warning: the CSV binds iteration 3's costs (the multimodal model's microbatches drawn "
                              "at seed 3); torch runs this one order every step")
    table = sample_durations(VariabilityModel(workload="multimodal"), PipelineShape(4, 1, 8), 3)
    expected = builtin_hint("bfw", 4, 1, 8, costs=table.expected().microbatch_costs)
    # bfw runs the heaviest first: in torch, its microbatches are renamed ([Note: torch's loss order])
    renamed, names = in_torch_loss_order(expected)
    assert names == last_stage_forwards(expected) != list(range(8))
    assert load_hint(tmp_path / "s.csv").orders == renamed.orders
    assert f"microbatch k being iteration 3's microbatch {names}[k]; feed torch the microbatches in that order" \
        in warning
    later = sample_durations(VariabilityModel(workload="multimodal"), PipelineShape(4, 1, 8), 4)
    other = builtin_hint("bfw", 4, 1, 8, costs=later.expected().microbatch_costs)
    assert other.orders != expected.orders  # another iteration binds another order


def test_freeze_iteration_binds_a_cost_ranked_file(tmp_path):
    ranked = as_cost_ranked(builtin_hint("1f1b", 4, 1, 8), [8.0 - k for k in range(8)], "1f1b by cost")
    save_hint(ranked, tmp_path / "ranked.json")
    result = run_cli(tmp_path, "hints", "export", "ranked.json", "--workload", "multimodal", "--torch-csv", "s.csv",
                     "--freeze-iteration", "2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["frozen_iteration"] == 2 and "binds iteration 2's costs" in data["warnings"][0]
    table = sample_durations(VariabilityModel(workload="multimodal"), ranked.shape, 2)
    bound, names = in_torch_loss_order(concrete(ranked, table))
    assert load_hint(tmp_path / "s.csv").orders == bound.orders
    assert data["renamed_microbatches"] == names == last_stage_forwards(concrete(ranked, table))
    assert "feed torch the microbatches in that order" in data["warnings"][1]


def test_the_csv_and_the_json_hold_the_renamed_order_torch_runs(tmp_path):
    """A hint file whose last stage runs 1F1 before 1F0: both outputs rename them; check_runs_in_torch refuses
    the order as it is, and torch's lowering would not have (it checks dependencies, not the loss order)."""
    plain = builtin_hint("1f1b", 2, 1, 3)
    swapped = HintOrder(plain.shape, relabelled(plain.orders, [1, 0, 2]), "swapped")
    save_hint(swapped, tmp_path / "h.json")
    with pytest.raises(HintError, match=r"hint swapped: runs 1F1 before 1F0, but torch looks the last stage's losses "
                                        r"up by the order its forwards ran"):
        check_runs_in_torch(swapped, check_completes)
    result = run_cli(tmp_path, "hints", "export", "h.json", "--torch-csv", "s.csv", "--out", "o.json", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["renamed_microbatches"] == [1, 0, 2] and "the hint's microbatch [1, 0, 2][k]" in data["warnings"][0]
    assert load_hint(tmp_path / "s.csv").orders == load_hint(tmp_path / "o.json").orders == plain.orders
    assert load_hint(tmp_path / "o.json").provenance["renamed_microbatches"] == [1, 0, 2]


def test_freeze_iteration_on_an_index_order_binds_nothing(tmp_path):
    result = run_cli(tmp_path, "hints", "export", "1f1b", "-p", "2", "-m", "4", "--torch-csv", "s.csv",
                     "--freeze-iteration", "1")
    assert result.returncode == 0 and "1f1b does not depend on costs" in result.stderr
    assert load_hint(tmp_path / "s.csv").orders == builtin_hint("1f1b", 2, 1, 4).orders


# -- tune-hint --target torch ---------------------------------------------------------


@pytest.mark.parametrize("placement", ["looping", "v"])
def test_tune_hint_for_torch_writes_a_csv_that_loads_back_and_runs_in_fixed_order(tmp_path, placement):
    result = run_cli(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8", "--jitter", "0.1",
                     "--placement", placement, "--target", "torch", "--out", "t", *TUNE, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"]["rule"] == "fixed" and data["memory_budget"] == "1f1b"
    assert {"schedule.csv", "torch_schedule.md", "hint.json", "job.toml", "report.json", "report.md"} == \
        set(_files(tmp_path / "t"))
    hint = load_hint(tmp_path / "t" / "hint.json")
    assert not hint.cost_ranked  # torch runs one order every step: an index order
    csv = load_hint(tmp_path / "t" / "schedule.csv", placement)
    assert csv.orders == hint.orders and csv.shape == hint.shape
    check_completes(csv)
    name = "ZBVZeroBubble" if placement == "v" else "1F1B"
    target = data["target"]
    assert target["schedule"] == name and target["microbatches"] == 8 and target["torch_lowering"]
    notes = (tmp_path / "t" / "torch_schedule.md").read_text()
    csv_path = str((tmp_path / "t" / "schedule.csv").resolve())
    for text in (f"`{csv_path}`", f"--parallelism.pipeline_parallel_schedule {name}",
                 f"--parallelism.pipeline_parallel_schedule_csv {csv_path}", "--parallelism.num_pp_microbatches 8",
                 f"schedule._load_csv({csv_path!r})", "n_microbatches=8"):
        assert text in notes, text
    assert 'policy = "fixed"' in (tmp_path / "t" / "job.toml").read_text()
    assert "## For torch" in (tmp_path / "t" / "report.md").read_text()


@pytest.mark.parametrize("policy", ["ready", "auto"])
def test_tune_hint_for_torch_refuses_a_ready_policy(tmp_path, policy):
    line = one_error_line(run_cli(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8",
                                  "--target", "torch", "--policy", policy, "--out", "t"))
    assert line.startswith(f"error: --policy: --target torch tunes fixed orders only: torch runs the schedule CSV in "
                           f"exactly its order every step, so a --policy {policy} result")
    assert _files(tmp_path) == []


def test_tune_hint_for_torch_keeps_an_explicit_memory_budget(tmp_path):
    result = run_cli(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8", "--target", "torch",
                     "--memory-budget", "2x", "--out", "t", *TUNE, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["memory_budget"] == "2x" and data["target"]["memory_budget_from"] == "--memory-budget"


@pytest.mark.parametrize("schedule, budget", [("1f1b", "1f1b"), ("gpipe", "8"), ("odd", "held")])
def test_the_torch_budget_is_what_the_traced_schedule_held(schedule, budget):
    from rrfp_cli.cmd_tune import _held_budget
    from runtime.tune.decide import HeldBudget
    from runtime.tune.evaluator import Candidate

    shape = PipelineShape(4, 1, 8)
    if schedule == "odd":  # GPipe's forwards on rank 0, 1F1B elsewhere: no spelling says these peaks
        hint = HintOrder(shape, (builtin_hint("gpipe", 4, 1, 8).orders[0], *builtin_hint("1f1b", 4, 1, 8).orders[1:]),
                         "odd")
    else:
        hint = builtin_hint(schedule, 4, 1, 8)
    held, source = _held_budget({"traced": Candidate(f"{schedule} (traced)", "traced", "fixed", hint)}, shape)
    assert source == f"the traced run's schedule ({hint.name})"
    if budget == "held":
        assert held == HeldBudget((8, 3, 2, 1), source)
    else:
        assert held == budget
    assert _held_budget({"traced": None}, shape) == ("1f1b", "the baseline order of the shape (1f1b)")
    ready = Candidate("gpipe (traced)", "traced", "lookahead", builtin_hint("gpipe", 4, 1, 8))
    assert _held_budget({"traced": ready, "meta": {"memory_budget": "2x"}}, shape) == \
        ("2x", "the traced run's budget (2x, under --policy ready)")  # what its arbiter let it hold
