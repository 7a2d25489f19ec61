"""The distributed runtime on real processes (gloo, CPU): same results as one process, reordering, budgets.

Every job of this module runs in one of two launches, one of 2 ranks and one of 4 (tests.helpers.jobs: starting
ranks is the slow part on 2 cores; each launch is a subprocess with a hard timeout, so a bug can fail these
tests but never hang CI). Each test reads the results of its own jobs. The emulated stage's sleeps, in one
process: tests/inproc/test_workloads.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hints.orders import applicable_builtins, builtin_hint
from runtime.config import RunConfig, run_shape
from runtime.sched.baselines import SORTED_1F1B
from runtime.sched.budget import MemoryBudget
from tests.helpers.jobs import check_against_reference, check_budget, run_jobs

ITERS = 2


def matrix(stages: int, microbatches: int) -> list[dict]:
    """Every built-in (cp included) x fixed and ready; ready looks ahead on multimodal, is greedy on gpt.

    The sorted 1F1Bs are 1F1B relabelled, like bfw is bf: they run once each in SORTED_JOBS instead."""
    jobs = []
    for workload, lookahead in (("gpt", False), ("multimodal", True)):
        for chunks in (1, 2):
            for hint in [*applicable_builtins(stages, chunks, microbatches), "cp"]:
                if hint in SORTED_1F1B:
                    continue
                for policy in ("fixed", "ready"):
                    config = dict(workload=workload, ranks=stages, chunks=chunks, microbatches=microbatches,
                                  hint=hint, policy=policy, iters=ITERS, seed=stages)
                    if policy == "ready":
                        config["lookahead"] = lookahead
                    jobs.append({"name": f"{workload}-v{chunks}-{hint}-{policy}", "config": config})
    return jobs


# 1B0 on rank 1 is held up; rank 0's hint head is 0B0, but with a 2x budget it may run 0F2 first.
REORDER = dict(workload="gpt", ranks=2, microbatches=4, hint="1f1b", iters=2, memory_budget="2x", delay={"1B0": 0.3})
REORDER_JOBS = [{"name": "ready", "config": {**REORDER, "policy": "ready"}},
                {"name": "fixed", "config": {**REORDER, "policy": "fixed"}}]
CURVE_JOBS = [{"name": f"{w}-{p}", "config": dict(workload=w, ranks=2, chunks=2, microbatches=4, hint="zb",
                                                 policy=p, iters=4, memory_budget="2x", lr=3e-3)}
              for w in ("gpt", "multimodal") for p in ("fixed", "ready")]
EMULATED_JOB = {"name": "emu", "config": dict(workload="emulated", ranks=2, microbatches=4, iters=2,
                                              forward_time=0.004, hint="zb", memory_budget="2x",
                                              emulate="multimodal", jitter=0.2)}
# The sorted 1F1Bs on multimodal (whose microbatches differ in cost, so the order differs from 1F1B's).
SORTED_JOBS = [{"name": f"multimodal-v{chunks}-{hint}-{policy}",
                "config": dict(workload="multimodal", ranks=4, chunks=chunks, microbatches=8, hint=hint, policy=policy,
                               iters=ITERS, seed=4)}
               for chunks, hint, policy in ((1, "1f1b-light", "fixed"), (2, "1f1b-heavy", "ready"))]
# The planned order ([Note: planned orders] in runtime.sched.baselines): planned per iteration on its expected
# costs within the budget, a split backward in an order of the plan's own; fixed and ready, two budgets.
PLANNED_JOBS = [{"name": f"{workload}-v{chunks}-planned-{policy}-{budget}",
                 "config": dict(workload=workload, ranks=4, chunks=chunks, microbatches=8, hint="planned",
                                policy=policy, memory_budget=budget, iters=ITERS, seed=4)}
                for workload, chunks, policy, budget in (("multimodal", 1, "fixed", "1f1b"), ("gpt", 2, "ready", "2x"),
                                                         ("multimodal", 2, "fixed", "2x"))]
V_SHAPES = [(2, 4, ("gpt", "emulated", "multimodal")), (4, 8, ("gpt",))]


def v_jobs(stages: int, microbatches: int, workloads: tuple[str, ...]) -> list[dict]:
    """V placement ([Note: placement] in hints.tasks): zbv in fixed order and ready (with and without
    lookahead), torch's DualPipeV in fixed order, and gpipe placed in a V, ready."""
    jobs = []
    for workload in workloads:
        base = dict(workload=workload, ranks=stages, microbatches=microbatches, iters=ITERS, seed=stages,
                    forward_time=0.002)
        runs = [("zbv-fixed", dict(hint="zbv", policy="fixed")),
                ("zbv-ready", dict(hint="zbv", policy="ready", lookahead=True)),
                ("zbv-greedy-2x", dict(hint="zbv", policy="ready", lookahead=False, memory_budget="2x")),
                ("dualpipev-fixed", dict(hint="torch:DualPipeV", policy="fixed")),
                ("gpipe-v-ready", dict(hint="gpipe", placement="v", policy="ready"))]
        jobs += [{"name": f"{workload}-{name}", "config": {**base, **extra}} for name, extra in runs]
    return jobs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every 2-rank job of this module, in one launch: the matrix, reordering, the training curve, the emulated
    model, V placement. ``root`` (job NAME wrote under root/run/NAME) and ``results``."""
    root = tmp_path_factory.mktemp("two")
    jobs = [*matrix(2, 4), *REORDER_JOBS, *CURVE_JOBS, EMULATED_JOB, *v_jobs(*V_SHAPES[0])]
    return SimpleNamespace(root=root, results=run_jobs(root, 2, jobs, limit=900))


def mixed_split_jobs(root) -> list[dict]:
    """A cp hint that splits stages 2-3 and keeps 0-1 whole ([Note: which stages split]), from a file, on both
    workloads, fixed and ready."""
    from dataclasses import replace

    from hints.files.hint_json import save_hint
    from hints.orders import HintOrder, by_priority
    from hints.priorities import cp_priorities
    from hints.tasks import PipelineShape
    from runtime.durations.variability import VariabilityModel
    from runtime.sched.evaluate import durations_for

    shape = replace(PipelineShape(4, 1, 8, True), fused_stages=frozenset({0, 1}))
    priorities = cp_priorities(shape, durations_for(shape, VariabilityModel(), 0).expected())
    path = root / "mixed-cp.json"
    save_hint(HintOrder(shape, tuple(map(tuple, by_priority(4, 1, 8, priorities))), "cp-mixed"), path)
    return [{"name": f"{workload}-mixed-{policy}",
             "config": dict(workload=workload, ranks=4, microbatches=8, hint=str(path), policy=policy, iters=ITERS,
                            seed=4)}
            for workload in ("gpt", "multimodal") for policy in ("fixed", "ready")]


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Every 4-rank job of this module, in one launch: the matrix, V placement, a hint splitting some stages."""
    root = tmp_path_factory.mktemp("four")
    jobs = [*matrix(4, 8), *v_jobs(*V_SHAPES[1]), *mixed_split_jobs(root), *SORTED_JOBS, *PLANNED_JOBS]
    return SimpleNamespace(root=root, results=run_jobs(root, 4, jobs, limit=900))


@pytest.fixture(scope="module")
def two_stage(two_ranks):
    return matrix(2, 4), two_ranks.results


@pytest.fixture(scope="module")
def four_stage(four_ranks):
    return matrix(4, 8), four_ranks.results


@pytest.mark.parametrize("launched", ["two_stage", "four_stage"])
def test_every_hint_and_policy_matches_single_process(launched, request):
    jobs, results = request.getfixturevalue(launched)
    assert len(jobs) == 48  # 2 workloads x (6 hints with 1 chunk + 6 with 2 chunks) x 2 policies
    for job in jobs:
        check_against_reference(results, job)
        check_budget(results, job)


def test_sorted_1f1b_matches_single_process(four_ranks):
    for job in SORTED_JOBS:
        check_against_reference(four_ranks.results, job)
        check_budget(four_ranks.results, job)


def test_the_planned_order_matches_single_process_within_its_budget(four_ranks):
    for job in PLANNED_JOBS:
        check_against_reference(four_ranks.results, job)
        check_budget(four_ranks.results, job)
        config = job["config"]
        slots = MemoryBudget.parse(config["memory_budget"]).per_rank(run_shape(RunConfig(**config)))
        executed = []
        for rank, rank_results in four_ranks.results.items():
            result = rank_results[job["name"]]
            assert result["peak_in_flight"] <= slots[rank], job["name"]  # in fixed order too
            executed += result["executed"]
        assert any("W" in task for task in executed), job["name"]  # a split backward


def test_a_hint_splitting_some_stages_matches_single_process(four_ranks):
    """Stages 0-1 run B, stages 2-3 run I and W (stage 1's B waits for stage 2's I): same gradients."""
    jobs = mixed_split_jobs(four_ranks.root)
    for job in jobs:
        check_against_reference(four_ranks.results, job)
        check_budget(four_ranks.results, job)


def test_fixed_runs_the_hint_exactly(four_stage):
    jobs, results = four_stage
    for job in jobs:
        c = job["config"]
        if c["policy"] != "fixed":
            continue
        if c["hint"] in ("bfw", "cp"):
            continue  # rebuilt per iteration from that iteration's expected costs
        hint = builtin_hint(c["hint"], c["ranks"], c["chunks"], c["microbatches"])
        for rank, rank_results in results.items():
            assert rank_results[job["name"]]["executed"] == [str(t) for t in hint.orders[rank]], job["name"]


def test_readiness_first_reorders_and_still_matches(two_ranks):
    # 1B0 on rank 1 is held up; rank 0's hint head is 0B0, but with a 2x budget it may run
    # 0F2 first. Results must not change.
    jobs, results = REORDER_JOBS, two_ranks.results
    hint = [str(t) for t in builtin_hint("1f1b", 2, 1, 4).orders[0]]
    ready_order = results[0]["ready"]["executed"]
    assert results[0]["fixed"]["executed"] == hint
    assert ready_order != hint
    assert ready_order.index("0F2") < ready_order.index("0B0")
    for job in jobs:
        check_against_reference(results, job)
    # It used the room the 2x budget gives (fixed 1F1B holds at most 2 on rank 0), and no more.
    assert results[0]["fixed"]["peak_in_flight"] == 2
    assert 2 < results[0]["ready"]["peak_in_flight"] <= results[0]["ready"]["budget"] == 4


def test_training_curve_matches_over_several_steps(two_ranks):
    jobs, results = CURVE_JOBS, two_ranks.results
    for job in jobs:
        check_against_reference(results, job)
        losses = results[0][job["name"]]["losses"]
        assert losses[-1] < losses[0]  # it trains


def test_emulated_runs_and_writes_replayable_durations(two_ranks):
    results, tmp_path = two_ranks.results, two_ranks.root
    metrics = results[0]["emu"]["metrics"]
    assert [m["iteration"] for m in metrics] == [0, 1]
    assert all(m["unit"] == "samples/s" and m["throughput"] > 0 for m in metrics)
    import polars as pl

    table = pl.read_parquet(tmp_path / "run" / "emu" / "durations.parquet")
    assert table.columns == ["iteration", "stage", "kind", "microbatch", "duration"]
    assert table.height == 2 * 2 * 4 * 2


@pytest.mark.parametrize("stages,microbatches,workloads", V_SHAPES)
def test_v_placement_matches_single_process(request, stages, microbatches, workloads):
    # The turn (stages p-1 and p) hands off on rank p-1 without a message, and the loss is computed on
    # rank 0 (stage 2p-1): results must still equal the unpartitioned model's.
    jobs = v_jobs(stages, microbatches, workloads)
    results = request.getfixturevalue({2: "two_ranks", 4: "four_ranks"}[stages]).results
    zbv = builtin_hint("zbv", stages, 2, microbatches)
    for job in jobs:
        check_against_reference(results, job)
        check_budget(results, job)
        assert run_shape(RunConfig(**job["config"])).placement == "v"
        if job["name"].endswith("zbv-fixed"):
            for rank, rank_results in results.items():
                assert rank_results[job["name"]]["executed"] == [str(t) for t in zbv.orders[rank]], job["name"]
        # Rank 0 ran the last model stage (the loss) and rank p-1 both stages of the turn.
        assert f"{2 * stages - 1}F0" in results[0][job["name"]]["executed"]
        assert {f"{stages - 1}F0", f"{stages}F0"} <= set(results[stages - 1][job["name"]]["executed"])
