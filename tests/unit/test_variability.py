"""Variability models and recorded duration tables."""

from __future__ import annotations

import math
import random
import statistics

import polars as pl
import pytest

from hints.deps import TaskGraph
from hints.errors import UserError
from hints.tasks import B, I, PipelineShape, Task, W
from runtime.durations.tables import durations_frame_rows, load_durations
from runtime.durations.variability import (
    VariabilityModel,
    _noisy,
    sample_durations,
    sample_microbatches,
    split_parts,
    stage_cost,
)


def test_same_seed_same_durations_other_seed_differs():
    model = VariabilityModel(workload="multimodal", jitter=0.2, straggler_prob=0.05, comm_latency=0.001,
                             comm_jitter=0.3)
    shape = PipelineShape(4, 2, 8)
    a, b, c = (sample_durations(model, shape, s) for s in (1, 1, 2))
    assert a.forward == b.forward and a.send_forward == b.send_forward and a.specs == b.specs
    assert a.forward != c.forward


@pytest.mark.parametrize("sigma,prob", [(0.3, 0.0), (0.2, 0.1), (0.0, 0.25), (0.0, 0.0), (1.5, 0.5)])
def test_noisy_makes_random_randoms_own_draws(sigma, prob):
    # _noisy inlines normalvariate; it must give this interpreter's values and leave the generator in
    # the same state, or a seed would give another table than before.
    bases = [0.001 * (1 + k % 7) for k in range(2000)]
    mu, slowdown = -sigma * sigma / 2.0, 3.0
    reference = random.Random(5)
    expected = []
    for base in bases:
        value = base * math.exp(reference.normalvariate(mu, sigma)) if sigma > 0 else base
        expected.append(value * slowdown if prob > 0 and reference.random() < prob else value)
    inlined = random.Random(5)
    assert _noisy(bases, inlined.random, mu, sigma, prob, slowdown) == expected
    assert inlined.random() == reference.random()


def test_noise_does_not_change_microbatch_contents():
    quiet = sample_durations(VariabilityModel(workload="multimodal"), PipelineShape(2, 1, 16), 5)
    noisy = sample_durations(VariabilityModel(workload="multimodal", jitter=0.5), PipelineShape(2, 1, 16), 5)
    assert quiet.specs == noisy.specs
    assert quiet.microbatch_costs == noisy.microbatch_costs


def test_uniform_is_constant_and_scales_with_chunks():
    one = sample_durations(VariabilityModel(forward_time=0.01), PipelineShape(2, 1, 3), 0)
    assert {x for row in one.forward for x in row} == {0.01}
    assert {x for row in one.backward for x in row} == {0.02}
    two = sample_durations(VariabilityModel(forward_time=0.01), PipelineShape(2, 2, 3), 0)
    assert {x for row in two.forward for x in row} == {0.005}
    assert one.total_compute() == pytest.approx(two.total_compute())


def test_jitter_is_mean_one():
    model = VariabilityModel(jitter=0.5, forward_time=1.0)
    table = sample_durations(model, PipelineShape(1, 1, 4000), 3)
    assert statistics.fmean(table.forward[0]) == pytest.approx(1.0, rel=0.05)
    assert statistics.pstdev(table.forward[0]) > 0.3


def test_stragglers_slow_about_the_given_share():
    model = VariabilityModel(straggler_prob=0.1, straggler_slowdown=5.0, forward_time=1.0)
    table = sample_durations(model, PipelineShape(1, 1, 5000), 4)
    slowed = sum(1 for x in table.forward[0] if x == 5.0) / 5000
    assert 0.08 < slowed < 0.12
    assert set(table.forward[0]) == {1.0, 5.0}


def test_language_cost_follows_sequence_length():
    model = VariabilityModel(workload="language", attention=0.3)
    specs = sample_microbatches(model, 64, 0)
    lengths = {s.seq_len for s in specs}
    assert len(lengths) > 10 and all(128 <= x <= 8192 and x % 8 == 0 for x in lengths)
    median = type(specs[0])(0, model.seq_len_median, model.samples)
    assert stage_cost(model, median, 0, 4) == pytest.approx(1.0)
    double = type(specs[0])(0, 2 * model.seq_len_median, model.samples)
    assert stage_cost(model, double, 0, 4) == pytest.approx(0.7 * 2 + 0.3 * 4)


def test_multimodal_images_drive_only_the_vision_stages():
    model = VariabilityModel(workload="multimodal")
    specs = sample_microbatches(model, 32, 1)
    assert len({s.image_count for s in specs}) > 3
    stages = 8
    assert model.vision_stage_count(stages) == 2
    for spec in specs:
        vision = stage_cost(model, spec, 0, stages)
        assert vision == pytest.approx(max(0.02, spec.image_count / (model.samples * model.images_mean)))
        assert stage_cost(model, spec, 1, stages) == vision
        language = stage_cost(model, spec, 2, stages)
        assert language == stage_cost(model, spec, 7, stages)
    none = type(specs[0])(0, model.text_tokens, model.samples, (0,) * model.samples)
    assert stage_cost(model, none, 0, stages) == 0.02


def test_model_rejects_bad_knobs():
    with pytest.raises(UserError, match="unknown workload"):
        VariabilityModel(workload="video")
    with pytest.raises(UserError) as caught:
        VariabilityModel(jitter=-1)
    assert caught.value.where == "`jitter`"  # [Note: inputs in messages]
    with pytest.raises(UserError):
        VariabilityModel(straggler_prob=2)


def test_split_backward_halves_b_unless_recorded():
    shape = PipelineShape(2, 1, 2, split_backward=True)
    table = sample_durations(VariabilityModel(forward_time=1.0), PipelineShape(2, 1, 2), 0)
    graph = TaskGraph.build(shape)
    compute, _ = table.for_graph(graph)
    per_kind = {graph.tasks[t].kind.value: compute[t] for t in range(len(graph))}
    assert per_kind == {"F": 1.0, "I": 1.0, "W": 1.0}


def write_table(path, rows, columns=("stage", "kind", "microbatch", "duration")):
    frame = pl.DataFrame(rows, schema=list(columns), orient="row")
    if str(path).endswith(".parquet"):
        frame.write_parquet(path)
    else:
        frame.write_csv(path)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_recorded_table_round_trip(tmp_path, suffix):
    table = sample_durations(VariabilityModel(workload="language", jitter=0.1), PipelineShape(2, 2, 3), 9)
    path = tmp_path / f"d{suffix}"
    write_table(path, durations_frame_rows(table))
    loaded = load_durations(path, 4, 3, comm_latency=0.5)
    assert loaded.forward == table.forward
    assert loaded.backward == table.backward
    assert loaded.send_forward[0] == [0.5] * 3 and loaded.send_forward[3] == [0.0] * 3


def test_recorded_split_backward_gives_b_as_sum(tmp_path):
    rows = []
    for k in range(2):
        for i in range(2):
            rows += [(k, "F", i, 1.0), (k, "I", i, 0.5), (k, "W", i, 0.25)]
    path = tmp_path / "split.csv"
    write_table(path, rows)
    loaded = load_durations(path, 2, 2)
    assert loaded.backward == [[0.75, 0.75], [0.75, 0.75]]
    graph = TaskGraph.build(PipelineShape(2, 1, 2, split_backward=True))
    compute, _ = loaded.for_graph(graph)
    assert sorted(set(compute)) == [0.25, 0.5, 1.0]


@pytest.mark.parametrize(
    "rows,columns,message",
    [
        ([(0, "F", 0, -1.0)], None, "must be a number >= 0"),
        ([(0, "F", 0, 1.0)], ("stage", "kind", "mb", "duration"), "missing column 'microbatch'"),
        ([(0, "X", 0, 1.0)], None, "kind must be F, B, I or W"),
        ([(5, "F", 0, 1.0)], None, "outside 1 stages x 1 microbatches"),
        ([(0, "F", 0, 1.0), (0, "F", 0, 2.0)], None, "appears twice"),
        ([(0, "F", 0, 1.0)], None, "no duration for task 0B0"),
    ],
)
def test_recorded_table_errors(tmp_path, rows, columns, message):
    path = tmp_path / "bad.csv"
    write_table(path, rows, columns or ("stage", "kind", "microbatch", "duration"))
    with pytest.raises(UserError, match=message) as caught:
        load_durations(path, 1, 1)
    assert str(path) in str(caught.value)


def test_recorded_table_unreadable(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"\x00\x01not parquet")
    with pytest.raises(UserError, match="cannot read as Parquet"):
        load_durations(path, 1, 1)
    with pytest.raises(UserError, match="no such file"):
        load_durations(tmp_path / "absent.csv", 1, 1)


# -- split_overhead ([Note: split backward durations]) --------------------------------------------


@pytest.mark.parametrize("overhead", [1.0, 1.6, 2.0])
def test_split_overhead_charges_w_in_for_graph_and_its_expectation(overhead):
    model = VariabilityModel(workload="multimodal", forward_time=1.0, jitter=0.3, split_overhead=overhead)
    table = sample_durations(model, PipelineShape(2, 1, 4), 7)
    split = TaskGraph.build(PipelineShape(2, 1, 4, split_backward=True))
    full = TaskGraph.build(PipelineShape(2, 1, 4))
    for durations in (table, table.expected()):
        full_compute = dict(zip(full.tasks, durations.for_graph(full)[0]))
        for task, seconds in zip(split.tasks, durations.for_graph(split)[0]):
            b = durations.backward[task.stage][task.microbatch]
            assert full_compute[Task(task.stage, B, task.microbatch)] == b  # a full hint's B: unchanged
            if task.kind is I:
                assert seconds == pytest.approx(b / 2)
            elif task.kind is W:
                assert seconds == pytest.approx(b * (overhead - 0.5))
    # I + W = overhead x B; the split parts the emulated stage sleeps are the same numbers
    assert sum(split_parts(2.0, overhead)) == pytest.approx(2.0 * overhead)
    assert split_parts(2.0, overhead) == (1.0, 2.0 * (overhead - 0.5))


def test_split_overhead_one_is_the_legacy_halves_exactly():
    table = sample_durations(VariabilityModel(workload="language", jitter=0.2, split_overhead=1.0), PipelineShape(3, 2, 6), 3)
    graph = TaskGraph.build(PipelineShape(3, 2, 6, split_backward=True))
    compute, _ = table.for_graph(graph)
    for task, seconds in zip(graph.tasks, compute):
        if task.kind.value in "IW":
            assert seconds == table.backward[task.stage][task.microbatch] / 2  # bit for bit


@pytest.mark.parametrize("bad", [0.99, 0.0, -1.0, float("nan"), float("inf"), True, "1.5"])
def test_split_overhead_rejects_bad_values(bad):
    with pytest.raises(UserError) as caught:
        VariabilityModel(split_overhead=bad)
    assert caught.value.where == "`split_overhead`"  # the library's name for it ([Note: inputs in messages])
