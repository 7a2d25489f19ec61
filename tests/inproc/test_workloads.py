"""Workloads in one process: the emulated stage sleeps a split backward's price in I and W, a user model's
microbatches reach the cost-ranked hints, and what a factory returns is checked in one line. Trained on real
ranks: tests/multiproc/test_runtime.py and tests/multiproc/test_user_model.py."""

from __future__ import annotations

import pytest
import torch

from runtime.config import RunConfig, run_shape


@pytest.mark.parametrize("split, overhead", [(False, 1.6), (True, 1.0), (True, 1.6)])
def test_emulated_stage_sleeps_the_split_overhead_in_w(monkeypatch, split, overhead):
    """[Note: split backward durations]: a split backward sleeps B/2 in I and (overhead - 1/2) x B in W; a full
    B sleeps B whatever the overhead."""
    import runtime.workloads.builtin as workloads
    from runtime.workloads.make import make_workload

    config = RunConfig(workload="emulated", emulate="uniform", ranks=2, microbatches=2, forward_time=0.001,
                       split_overhead=overhead)
    workload = make_workload(config, run_shape(config))
    workload.split_stages = frozenset({0, 1}) if split else frozenset()
    stage = workload.build_stage(1)
    batch = workload.batch(0, 0)
    x = torch.randn(2, 32, requires_grad=True)
    (y,) = stage((x,), batch)
    slept: list[float] = []
    monkeypatch.setattr(workloads.time, "sleep", slept.append)
    backward = workload.durations(0).backward[1][0]
    if split:
        torch.autograd.grad(y.sum(), [x], retain_graph=True)  # I
        assert slept == [pytest.approx(backward / 2)]
        torch.autograd.grad(y.sum(), [stage.linear.weight])  # W
        assert slept[1:] == [pytest.approx(backward * (overhead - 0.5))]
    else:
        y.sum().backward()
        assert sorted(slept) == [pytest.approx(backward / 2)] * 2


def test_cost_features_reach_the_cost_ranked_hints():
    from runtime.workloads.make import make_workload

    config = RunConfig(workload="tests.helpers.user_models:tiny", ranks=2, microbatches=3)
    workload = make_workload(config, run_shape(config))
    workload.prepare([0])
    rows = [workload.batch(0, mb).spec.seq_len for mb in range(3)]
    assert rows == [2, 3, 4]  # the tiny model's microbatches hold 2, 3, 4 rows and report them as tokens
    expected = workload.expected(0)
    assert expected.forward[0][0] < expected.forward[0][1] < expected.forward[0][2]


def test_what_a_factory_returns_is_checked_in_one_line(monkeypatch):
    from hints.errors import UserError
    from runtime.workloads.user import ModelContext, PipelineModel, build_model

    ctx = ModelContext(RunConfig(), ranks=2, chunks=1, microbatches=2, placement=((0, 0), (1, 0)), seed=0)

    def raising(ctx):
        raise ValueError("no such checkpoint of my own")

    with pytest.raises(UserError, match="the factory raised ValueError: no such checkpoint of my own"):
        build_model(raising, ctx)
    with pytest.raises(UserError, match="must return a runtime.workloads.user.PipelineModel, got dict"):
        build_model(lambda ctx: {}, ctx)
    with pytest.raises(UserError, match="stage 1 is a str, not a torch.nn.Module"):
        build_model(lambda ctx: PipelineModel([torch.nn.Linear(1, 1), "layer"], None, []), ctx)
    with pytest.raises(UserError, match="unit must be tokens or samples, got 'images'"):
        build_model(lambda ctx: PipelineModel([torch.nn.Linear(1, 1)] * 2, None, [], unit="images"), ctx)
