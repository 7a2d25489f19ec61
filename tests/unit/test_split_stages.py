"""Some stages split, others not ([Note: which stages split] in runtime/sched/split_choice.py): the task model's
``fused_stages``, its dependencies and task ids, hint files, torch CSV, the ``cp`` choice, simulation, traces."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hints.deps import TaskGraph, prerequisites
from hints.errors import HintError, UserError
from hints.files.hint_json import save_hint
from hints.files.load import load_hint
from hints.files.torch_csv import save_torch_csv
from hints.orders import HintOrder, by_priority, peak_in_flight
from hints.priorities import cp_priorities
from hints.tasks import B, F, I, PipelineShape, Task, V, W
from hints.validate import validate_orders
from runtime.durations.variability import VariabilityModel
from runtime.sched.evaluate import durations_for, resolve
from runtime.sched.simulator import check_completes, simulate
from runtime.sched.split_choice import _run, choose_split

MIXED = PipelineShape(4, 1, 3, split_backward=True, fused_stages=frozenset({0, 1}))


def mixed_cp(shape: PipelineShape = MIXED) -> HintOrder:
    table = durations_for(shape, VariabilityModel(), 0)
    orders = by_priority(shape.ranks, shape.chunks, shape.microbatches, cp_priorities(shape, table.expected()),
                         shape.placement)
    return HintOrder(shape, tuple(map(tuple, orders)), "cp")


def test_fused_stages_run_b_and_the_others_i_and_w():
    assert [MIXED.kinds_of(s) for s in range(4)] == [(F, B), (F, B), (F, I, W), (F, I, W)]
    assert MIXED.split_stages == (2, 3) and MIXED.kinds == (F, B, I, W)
    assert MIXED.total_tasks == 3 * (2 + 2 + 3 + 3) and [MIXED.tasks_of(r) for r in range(4)] == [6, 6, 9, 9]
    assert MIXED.contains(Task(1, B, 0)) and not MIXED.contains(Task(1, I, 0)) and not MIXED.contains(Task(2, B, 0))
    assert MIXED.describe() == "4 ranks x 1 chunks, 3 microbatches, split backward (fused at stages 0-1)"
    assert MIXED.describe_backward() == "split (I + W) at stages 2-3, whole (B) at 0-1"
    assert MIXED.with_split(False).describe_backward() == "whole (B) at every stage"
    assert MIXED.with_split(True).describe_backward() == "split (I + W) at every stage"


def test_a_fused_stage_waits_for_the_input_gradient_of_whichever_kind_the_next_stage_sends():
    assert prerequisites(Task(1, B, 0), MIXED) == (Task(1, F, 0), Task(2, I, 0))  # stage 2 splits: its I
    assert prerequisites(Task(0, B, 0), MIXED) == (Task(0, F, 0), Task(1, B, 0))  # stage 1 is fused: its B
    assert prerequisites(Task(2, W, 0), MIXED) == (Task(2, I, 0),)


@pytest.mark.parametrize("shape", [MIXED, PipelineShape(2, 2, 4, True, V, frozenset({1, 2})),
                                   PipelineShape(3, 2, 2, True, fused_stages=frozenset({5}))])
def test_task_ids_number_every_task_once_in_shape_order(shape):
    graph = TaskGraph.build(shape)
    assert graph.tasks == list(shape.tasks())
    assert [graph.tid(t) for t in shape.tasks()] == list(range(shape.total_tasks))
    assert graph.ids(graph.tasks) == list(range(len(graph)))
    finals = [t for t, frees in zip(graph.tasks, graph.frees) if frees]
    assert finals == [t for t in graph.tasks if t.kind is shape.final_backward_of(t.stage)]


@pytest.mark.parametrize("fused, split, what", [
    ({1}, False, "this shape splits none"), ({4}, True, "4 is not a stage of 4"), ({-1}, True, "-1 is not a stage"),
])
def test_bad_fused_stages_are_refused(fused, split, what):
    with pytest.raises(UserError, match=what):
        PipelineShape(4, 1, 2, split, fused_stages=frozenset(fused))


def test_a_mixed_hint_validates_completes_and_frees_memory_at_each_stages_last_backward():
    hint = mixed_cp()
    validate_orders(hint.shape, hint.orders)
    check_completes(hint)
    result = simulate(hint, durations_for(MIXED, VariabilityModel(), 0), "ready")
    assert len(result.graph) == MIXED.total_tasks
    assert all(peak <= slots for peak, slots in zip(result.peak_in_flight, result.budgets))  # freed at B or W
    assert [peak_in_flight(o, MIXED) for o in hint.orders] == [3, 3, 3, 3]  # cp's own order holds every microbatch
    wrong = [list(o) for o in hint.text_orders()]
    wrong[0] = [t.replace("B", "I") for t in wrong[0]]  # stage 0 is fused: it has no I
    with pytest.raises(HintError, match="outside the shape"):
        validate_orders(MIXED, [[Task.parse(t) for t in o] for o in wrong])


def test_hint_files_and_torch_csv_keep_the_fused_stages(tmp_path):
    hint = mixed_cp()
    save_hint(hint, tmp_path / "h.json")
    assert json.loads((tmp_path / "h.json").read_text())["shape"]["fused_stages"] == [0, 1]
    assert load_hint(tmp_path / "h.json").shape == MIXED
    save_torch_csv(hint, tmp_path / "h.csv")
    assert load_hint(tmp_path / "h.csv").shape == MIXED
    everything = json.loads((tmp_path / "h.json").read_text())
    for bad, what in (("0", "must be a list of stage numbers"), ([0, True], "must be a list of stage numbers"),
                      ([7], "7 is not a stage of 4")):
        everything["shape"]["fused_stages"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(everything))
        with pytest.raises(HintError, match=what):
            load_hint(tmp_path / "bad.json")


def _expected(overhead: float, ranks: int = 8, microbatches: int = 32, seed: int = 3):
    shape = PipelineShape(ranks, 1, microbatches, True)
    model = VariabilityModel(workload="multimodal", jitter=0.1, split_overhead=overhead)
    return shape, durations_for(shape, model, seed).expected()


@pytest.mark.parametrize("overhead", [1.0, 1.14, 1.33, 1.65])
def test_cp_splits_where_it_pays_and_is_never_slower_than_every_stage_or_none(overhead):
    shape, expected = _expected(overhead)
    chosen = choose_split(shape, expected)
    every = shape.with_split(True)
    none = replace(every, fused_stages=frozenset(range(shape.stages)))
    best = _run(chosen, expected).makespan
    assert best <= _run(every, expected).makespan + 1e-12 and best <= _run(none, expected).makespan + 1e-12
    split = chosen.split_stages
    assert split == tuple(range(split[0], shape.stages)) if split else True  # a suffix of the stages


def test_a_free_split_splits_and_a_dear_one_does_not():
    shape, free = _expected(1.0)
    # a free split is taken wherever it shortens the iteration; where it changes nothing (stage 0, whose input
    # gradient nobody waits for) the tie goes to no split
    split = choose_split(shape, free).split_stages
    assert split and split[-1] == shape.stages - 1 and 0 not in split
    _, dear = _expected(2.0)
    assert choose_split(shape, dear).split_stages == ()


def test_cp_resolved_from_a_workload_records_its_choice():
    hint = resolve("cp", 8, 1, 32, durations_for(PipelineShape(8, 1, 32, True),
                                                 VariabilityModel(workload="multimodal", split_overhead=2.0), 0))
    assert hint.shape.fused_stages == frozenset(range(8)) and {t.kind for o in hint.orders for t in o} == {F, B}
    kept = resolve("cp", 8, 1, 32, durations_for(PipelineShape(8, 1, 32, True), VariabilityModel(), 0),
                   split=hint.shape)
    assert kept.shape == hint.shape  # a run keeps its first iteration's choice


def test_a_trace_says_which_stages_split(tmp_path):
    from profiler.analysis.summary import summary
    from profiler.analysis.windows import pipeline_shape
    from profiler.trace.reader import read_trace
    from tests.helpers.trace_builder import build_run

    tasks = {0: [("0F0", 0, 10), ("0B0", 40, 60)], 1: [("1F0", 12, 22), ("1I0", 24, 30), ("1W0", 30, 38)]}
    run = build_run(tmp_path, 2, 1, tasks, [], orders={0: ["0F0", "0B0"], 1: ["1F0", "1I0", "1W0"]})
    frames = read_trace(run)
    assert pipeline_shape(frames).fused_stages == frozenset({0})
    assert summary(frames)["backward"] == "split (I + W) at stages 1, whole (B) at 0"
