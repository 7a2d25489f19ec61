"""A CSV torch can run ([Note: a CSV torch can run] in hints/files/torch_csv.py): the fixed-order check and torch's
own lowering before anything is written, cost-ranked hints refused as they are, the schedule class whose placement
matches, and tune-hint's static candidates and held budget ([Note: one order every step] in runtime/tune/search.py).
"""

from __future__ import annotations

import importlib.util
import random

import pytest

from hints.errors import HintError, UserError
from hints.files.load import hint_placement, load_hint, resolve_hint
from hints.files.torch_csv import (
    check_torch_lowering,
    export_torch_csv,
    in_torch_loss_order,
    last_stage_forwards,
    torch_csv_text,
    torch_schedule_name,
    torch_schedule_notes,
)
from hints.files.torch_names import TORCH_PREFIX, TORCH_SCHEDULES
from hints.orders import HintOrder, applicable_builtins, as_cost_ranked, builtin_hint, peak_in_flight, relabelled
from hints.tasks import PipelineShape, Task
from hints.validate import validate_orders
from runtime.durations.variability import VariabilityModel
from runtime.sched.evaluate import resolve
from runtime.sched.results import ScheduleDeadlock
from runtime.sched.simulator import check_completes
from runtime.tune.decide import HeldBudget, tune
from runtime.tune.evaluator import Candidate, Evaluator, Objective
from runtime.tune.scenarios import from_model
from runtime.tune.search import as_static
from tests.helpers.schedules import random_completing_hint, random_order_hint

pytestmark = pytest.mark.unit

requires_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

SHAPES = [(4, 1, 8, "looping"), (3, 2, 6, "looping"), (2, 3, 4, "looping"), (4, 2, 8, "v"), (2, 1, 3, "looping")]


def malformed() -> HintOrder:
    """The issue's case in index form: GPipe where rank 2 runs 2B5 before 2F7, which rank 3 needs to produce 3B5.
    Every task once, each forward before its backward (valid), but it cannot complete in exactly this order."""
    gpipe = builtin_hint("gpipe", 4, 1, 8)
    rank2 = [Task.parse(t) for t in ["2F0", "2F1", "2F2", "2F3", "2F4", "2F5", "2F6", "2B5", "2F7",
                                     "2B0", "2B1", "2B2", "2B3", "2B4", "2B6", "2B7"]]
    orders = (*gpipe.orders[:2], tuple(rank2), gpipe.orders[3])
    validate_orders(gpipe.shape, orders, "malformed")
    return HintOrder(gpipe.shape, orders, "gpipe heaviest first + local search")


def every_builtin():
    """(name, hint) for every built-in each shape takes, cp and the cost-built ones included (uniform costs)."""
    params = []
    for ranks, chunks, microbatches, placement in SHAPES:
        names = [*applicable_builtins(ranks, chunks, microbatches, placement=placement), "cp"]
        for name in names:
            hint = resolve(name, ranks, chunks, microbatches, placement=placement, model=VariabilityModel())
            params.append(pytest.param(hint, id=f"{name}-p{ranks}v{chunks}m{microbatches}-{placement}"))
    return params


def test_the_malformed_order_is_refused_and_nothing_is_written(tmp_path):
    hint = malformed()
    path = tmp_path / "schedule.csv"
    with pytest.raises(HintError) as info:
        export_torch_csv(hint, path, check_completes)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("hint gpipe heaviest first + local search: torch runs a CSV in exactly its order")
    assert "cannot complete under the fixed policy" in message and "rank 0 waits at step 8 for 0B0" in message
    assert list(tmp_path.iterdir()) == []  # no CSV, no temporary file


def test_a_refused_export_leaves_the_old_file(tmp_path):
    path = tmp_path / "schedule.csv"
    path.write_text("old\n")
    with pytest.raises(HintError):
        export_torch_csv(malformed(), path, check_completes)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["schedule.csv"]


@requires_torch
def test_torch_lowering_refuses_the_malformed_order_too():
    # torch's own pass, asked without rrfp's check first: it says where it stops, as rrfp's check does.
    hint = malformed()
    with pytest.raises(HintError, match=r"cannot lower the CSV \(_add_send_recv: Malformed compute schedule\): no "
                                        r"rank can move; first: rank 0 at step 8 on 0B0 \(waits for 1I0 or 1B0\) "
                                        r"\(and 3 more ranks\); nothing written"):
        check_torch_lowering(hint, torch_csv_text(hint))


@requires_torch
def test_torch_validation_refusals_are_one_line():
    hint = builtin_hint("1f1b", 2, 1, 2)
    text = "0F0,0B0,0F1,0B1\n1F0,1B0\n"  # stage 1 misses microbatch 1
    with pytest.raises(HintError, match=r"refuses the CSV \(_validate_schedule\): Got 1 \S+ microbatches for "
                                        r"stage 1, expected 2; nothing written"):
        check_torch_lowering(hint, text)


@pytest.mark.parametrize("hint", every_builtin())
def test_every_builtin_exports_and_torch_lowers_it(tmp_path, hint):
    path = tmp_path / "schedule.csv"
    version = export_torch_csv(hint, path, check_completes)
    if importlib.util.find_spec("torch") is not None:
        assert version is not None  # torch's lowering ran and accepted it
    loaded = load_hint(path, hint.shape.placement)
    assert loaded.orders == hint.orders and loaded.shape == hint.shape


@requires_torch
@pytest.mark.parametrize("name", TORCH_SCHEDULES)
def test_torchs_own_schedules_round_trip_through_the_check(tmp_path, name):
    hint = resolve_hint(TORCH_PREFIX + name, 4, None, 8)
    assert export_torch_csv(hint, tmp_path / "s.csv", check_completes) is not None


@requires_torch
@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: f"p{s[0]}v{s[1]}m{s[2]}-{s[3]}")
def test_torch_lowering_and_the_fixed_order_check_agree(shape):
    """On orders a random swap away from a built-in: completes in fixed order iff torch can lower it."""
    ranks, chunks, microbatches, placement = shape
    rng = random.Random(f"{shape}")
    seen = {True: 0, False: 0}
    for base in [*applicable_builtins(ranks, chunks, microbatches, placement=placement).values()]:
        for _ in range(12):
            orders = [list(order) for order in base.orders]
            rank = rng.randrange(ranks)
            i, j = rng.randrange(len(orders[rank])), rng.randrange(len(orders[rank]))
            orders[rank][i], orders[rank][j] = orders[rank][j], orders[rank][i]
            try:
                validate_orders(base.shape, orders, "swap")
            except HintError:
                continue
            hint = HintOrder(base.shape, tuple(map(tuple, orders)), "swap")
            try:
                check_completes(hint)
                completes = True
            except ScheduleDeadlock:
                completes = False
            try:
                check_torch_lowering(hint, torch_csv_text(hint))
                lowers = True
            except HintError:
                lowers = False
            assert completes == lowers, hint.text_orders()
            seen[completes] += 1
    assert seen[True] and seen[False]  # both answers were asked


def test_a_cost_ranked_hint_is_refused_as_it_is(tmp_path):
    ranked = as_cost_ranked(builtin_hint("gpipe", 2, 1, 4), [4.0, 3.0, 2.0, 1.0], "gpipe by cost")
    with pytest.raises(HintError, match=r"hint gpipe by cost: is cost-ranked: .* bind it to one iteration's costs "
                                        r"first \(`freeze_iteration`\)"):
        export_torch_csv(ranked, tmp_path / "s.csv", check_completes)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shape, name", [
    (PipelineShape(4, 1, 8), "1F1B"),
    (PipelineShape(4, 1, 8, True), "1F1B"),
    (PipelineShape(4, 2, 8), "Interleaved1F1B"),
    (PipelineShape(4, 3, 8, True), "InterleavedZeroBubble"),
    (PipelineShape(4, 2, 8, True, "v"), "ZBVZeroBubble"),
])
def test_the_schedule_class_places_stages_as_the_shape_does(shape, name):
    assert torch_schedule_name(shape) == name
    assert hint_placement(TORCH_PREFIX + name) == shape.placement  # torchtitan places stages by this name


def test_the_notes_say_what_torch_and_torchtitan_need():
    hint = builtin_hint("interleaved-1f1b", 4, 3, 8)
    notes = torch_schedule_notes(hint, "/abs/schedule.csv", "2.13.0")
    for text in ("`/abs/schedule.csv`", "rank r holds stages r, r + 4, r + 8", "`ScheduleInterleaved1F1B`",
                 "Microbatches: 8 per step", "torch 2.13.0's lowering", "as microbatches 0, 1, 2, ..., as torch's loss",
                 "--parallelism.pipeline_parallel_degree 4",
                 "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
                 "--parallelism.pipeline_parallel_schedule_csv /abs/schedule.csv",
                 "--parallelism.num_pp_microbatches 8", "pipeline_parallel_microbatch_size",
                 "pipeline_parallel_layers_per_stage` so the model splits into 12 stages",
                 "schedule = _PipelineScheduleRuntime(stages, n_microbatches=8, loss_fn=loss_fn)",
                 "schedule._load_csv('/abs/schedule.csv')"):
        assert text in notes, text
    v = torch_schedule_notes(builtin_hint("zbv", 4, 2, 8), "s.csv", None)
    assert "a V: rank r holds stages r and 7 - r" in v and "ZBVZeroBubble" in v and "was not run" in v
    assert "layers_per_stage" not in v


# -- [Note: torch's loss order] -------------------------------------------------------


@pytest.mark.parametrize("shape", [PipelineShape(2, 2, 4), PipelineShape(3, 1, 5, True),
                                   PipelineShape(2, 2, 5, True, "v"), PipelineShape(4, 2, 6)],
                         ids=lambda s: s.describe())
def test_renaming_the_microbatches_keeps_the_order_and_puts_the_last_stages_forwards_in_turn(shape):
    seen = {True: 0, False: 0}
    for seed in range(40):
        hint = (random_completing_hint if seed % 2 else random_order_hint)(shape, seed)
        renamed, names = in_torch_loss_order(hint)
        assert last_stage_forwards(renamed) == list(range(shape.microbatches))
        if names is None:
            assert renamed is hint and last_stage_forwards(hint) == list(range(shape.microbatches))
            continue
        assert names == last_stage_forwards(hint) and renamed.shape == hint.shape and renamed.name == hint.name
        assert relabelled(renamed.orders, names) == hint.orders  # a renaming, nothing moved
        validate_orders(shape, renamed.orders, "renamed")
        assert [peak_in_flight(o, shape) for o in renamed.orders] == [peak_in_flight(o, shape) for o in hint.orders]
        assert _completes(renamed) == _completes(hint)
        seen[_completes(hint)] += 1
    assert seen[True] and seen[False]  # orders that complete and orders that deadlock were both renamed


def _completes(hint: HintOrder) -> bool:
    try:
        check_completes(hint)
    except ScheduleDeadlock:
        return False
    return True


def test_an_order_torch_would_look_its_losses_up_wrong_in_is_refused(tmp_path):
    hint = HintOrder(PipelineShape(2, 2, 3), relabelled(builtin_hint("interleaved-1f1b", 2, 2, 3).orders, [0, 2, 1]),
                     "swapped")
    with pytest.raises(HintError) as info:
        export_torch_csv(hint, tmp_path / "s.csv", check_completes)
    assert str(info.value) == ("hint swapped: runs 3F2 before 3F1, but torch looks the last stage's losses up by the "
                               "order its forwards ran, so they must run as microbatches 0, 1, 2, ... (else wrong "
                               "gradients); rename its microbatches (in_torch_loss_order does) for the same order, which "
                               "torch runs right")
    assert list(tmp_path.iterdir()) == []
    assert in_torch_loss_order(as_cost_ranked(hint, [1.0, 2.0, 3.0]))[1] is None  # slots: refused as they are


# -- tune-hint --target torch's pieces ------------------------------------------------


def test_static_candidates_are_index_orders_in_fixed_order_without_copies():
    shape = PipelineShape(2, 1, 4)
    scenarios = from_model(VariabilityModel(workload="multimodal"), shape, 2, 2, seed=0)
    mean = scenarios.tuning[0].expected
    gpipe = builtin_hint("gpipe", 2, 1, 4)
    candidates = [Candidate("bfw", "built-in", "greedy", builtin="bfw"),
                  Candidate("gpipe", "built-in", "lookahead", gpipe),
                  Candidate("gpipe heaviest", "cost classes", "greedy", as_cost_ranked(gpipe, [4.0, 3.0, 2.0, 1.0])),
                  Candidate("gpipe again", "priority", "fixed", gpipe)]
    static = as_static(candidates, shape, mean)
    assert all(c.rule == "fixed" and c.builtin is None and not c.hint.cost_ranked for c in static)
    # bfw is built from the mean costs; GPipe heaviest first, its slots bound by the same costs, is that very
    # order (one chunk: both passes heaviest first), and "gpipe again" is gpipe: both copies are dropped.
    assert [c.name for c in static] == ["bfw", "gpipe"]
    bfw = resolve("bfw", 2, 1, 4, mean)
    assert last_stage_forwards(bfw) != [0, 1, 2, 3]  # heaviest first: torch would look its losses up wrong
    assert static[0].hint.orders == in_torch_loss_order(bfw)[0].orders
    assert static[1].hint.orders == gpipe.orders
    assert all(last_stage_forwards(c.hint) == [0, 1, 2, 3] for c in static)  # [Note: torch's loss order]


def test_a_held_budget_keeps_every_fixed_order_within_what_each_rank_held():
    shape = PipelineShape(3, 1, 6)
    held = HeldBudget((3, 2, 2), "a schedule")
    assert held.per_rank(shape) == [3, 2, 2] and str(held) == "as a schedule held"
    with pytest.raises(UserError, match="holds 3 ranks but the shape has 2"):
        held.per_rank(PipelineShape(2, 1, 6))
    scenarios = from_model(VariabilityModel(workload="multimodal", jitter=0.1), shape, 4, 4, seed=1)
    outcome = tune(scenarios, "fixed", held, Objective.parse("mean"), 0.3, static=True)
    assert outcome.budget == "as a schedule held" and outcome.evaluator.slots == [3, 2, 2]
    chosen = outcome.verdict.chosen.candidate
    assert chosen.rule == "fixed" and chosen.hint is not None and not chosen.hint.cost_ranked
    peaks = [peak_in_flight(order, chosen.hint.shape) for order in chosen.hint.orders]
    assert all(peak <= slots for peak, slots in zip(peaks, [3, 2, 2]))
    check_completes(chosen.hint)


def test_every_static_candidate_simulated_runs_its_last_stages_forwards_in_turn(monkeypatch):
    """Local-search moves included: what is scored is what schedule.csv would hold ([Note: torch's loss order])."""
    simulated = []
    makespans = Evaluator.makespans
    monkeypatch.setattr(Evaluator, "makespans", lambda self, candidate, *args: (
        simulated.append(candidate), makespans(self, candidate, *args))[1])
    shape = PipelineShape(2, 1, 6)  # with room for 2x 1F1B's activations, moves swap the last stage's forwards
    scenarios = from_model(VariabilityModel(workload="multimodal", jitter=0.1), shape, 4, 4, seed=1)
    tune(scenarios, "fixed", "2x", Objective.parse("mean"), evaluations=600, static=True)
    assert sum(c.family == "local search" for c in simulated) > 100
    assert all(last_stage_forwards(c.hint) == list(range(6)) for c in simulated)


def test_a_static_tuning_refuses_a_ready_policy():
    scenarios = from_model(VariabilityModel(), PipelineShape(2, 1, 4), 2, 2, seed=0)
    with pytest.raises(UserError, match="fixed policy only"):
        tune(scenarios, "ready", "1f1b", Objective.parse("mean"), 0.1, static=True)
