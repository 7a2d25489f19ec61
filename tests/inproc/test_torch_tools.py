"""rrfp's runs read by torch's tools, in one process: the executor's ``PP:<task>`` ranges under
``torch.profiler`` ([Note: profiler ranges] in runtime/exec/ranges.py) and none when switched off or when no
profiler records; ``rrfp trace export --chrome`` through the CLI (the JSON itself: tests/unit/test_chrome_export.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from hints.deps import TaskGraph
from runtime.config import RunConfig, run_shape
from runtime.exec import ranges as ranges_module
from runtime.exec.executor import StageExecutor
from runtime.exec.ranges import NO_RANGE, TaskRanges, ranges_enabled
from runtime.sched.rules import make_arbiter
from runtime.workloads.make import make_workload
from tests.helpers.cli import one_error, run_cli
from tests.helpers.trace_builder import ONE_F_ONE_B, build_run


def _executor(ranges: bool | None = None) -> tuple[StageExecutor, TaskGraph]:
    """One rank holding both stages of a 2-stage model (interleaved: every hand-off local, no transport)."""
    config = RunConfig(workload="gpt", ranks=1, chunks=2, microbatches=2, policy="fixed", hidden=16, heads=2,
                       vocab=32, seq_len=8)
    shape = run_shape(config)
    graph = TaskGraph.build(shape)
    workload = make_workload(config, shape)
    modules = {stage: workload.build_stage(stage) for stage in shape.stages_of_rank(0)}
    return StageExecutor(0, graph, workload, modules, None, torch.device("cpu"), ranges=ranges), graph


def _iteration(executor: StageExecutor, graph: TaskGraph, iteration: int = 0):
    from hints.orders import builtin_hint

    shape = graph.shape
    order = builtin_hint("interleaved-1f1b", shape.ranks, shape.chunks, shape.microbatches).orders[0]
    return executor.run_iteration(iteration, make_arbiter("fixed", graph, 0, order))


def _pp_names(prof) -> list[str]:
    return [e.name for e in prof.events() if e.name.startswith("PP:")]


def test_every_task_is_a_pp_range_under_the_profiler():
    executor, graph = _executor()
    _iteration(executor, graph)  # outside any profiler: nothing to record, nothing breaks
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = _iteration(executor, graph, 1)
    names = _pp_names(prof)
    assert sorted(names) == sorted(f"PP:{task}" for task in result.executed)
    assert {"PP:0F0", "PP:1F0", "PP:1B1", "PP:0B1"} <= set(names)  # torch's action grammar: stage, kind, microbatch
    forward = next(e for e in prof.events() if e.name == "PP:0F0")
    assert any(child.name.startswith("aten::") for child in forward.cpu_children)  # the handler's ops are inside


def test_switched_off_the_executor_opens_no_range(monkeypatch):
    monkeypatch.setenv("RRFP_PROFILER_RANGES", "0")
    executor, graph = _executor()  # ranges=None reads the environment
    assert not executor.ranges.enabled
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _iteration(executor, graph)
    assert _pp_names(prof) == []
    monkeypatch.delenv("RRFP_PROFILER_RANGES")
    executor, graph = _executor(ranges=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _iteration(executor, graph)
    assert _pp_names(prof) == []


def test_the_switch_and_the_cheap_path(monkeypatch):
    assert ranges_enabled({}) and ranges_enabled({"RRFP_PROFILER_RANGES": "1"})
    assert not any(ranges_enabled({"RRFP_PROFILER_RANGES": v}) for v in ("0", "off", "False", " no "))
    from hints.tasks import Task

    task = Task.parse("1W3")
    cpu = TaskRanges(torch.device("cpu"), enabled=True)
    assert cpu.around(task) is NO_RANGE and not cpu.nvtx  # no profiler, no GPU: the shared no-op
    assert cpu.name(task) == "PP:1W3"
    assert TaskRanges(torch.device("cpu"), enabled=False).around(task) is NO_RANGE
    cuda = TaskRanges(torch.device("cuda"), enabled=True)
    assert cuda.nvtx and not TaskRanges(torch.device("cuda"), enabled=False).nvtx
    pushed = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pushed.append(name))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: pushed.append("pop"))
    monkeypatch.setattr(ranges_module, "_profiler_enabled", lambda: False)
    with cuda.around(task):
        pushed.append("work")
    assert pushed == ["PP:1W3", "work", "pop"]  # NVTX on a CUDA device even with no torch profiler


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("chrome-cli") / "run", **ONE_F_ONE_B, iterations=2, period_us=200)


def test_export_chrome_writes_a_folder_per_rank_or_one_file(run, tmp_path):
    done = run_cli(tmp_path, "trace", "export", run, "--chrome", tmp_path / "hta", "--json")
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["written"] == [str(tmp_path / "hta" / f"rank{r}_trace.json") for r in (0, 1)]
    done = run_cli(tmp_path, "trace", "export", run, "--chrome", tmp_path / "all.json")
    assert done.returncode == 0, done
    assert f"wrote {tmp_path / 'all.json'}" in done.stdout
    trace = json.loads((tmp_path / "all.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}


def test_export_chrome_bad_paths_are_one_error_line(run, tmp_path):
    one_error(run_cli(tmp_path, "trace", "export", run, "--chrome", tmp_path / "no" / "such.json"),
              "--chrome")
    (tmp_path / "taken.json").write_text("{}")
    one_error(run_cli(tmp_path, "trace", "export", run, "--chrome", tmp_path / "taken.json"), "pass --force")
    (tmp_path / "plain").write_text("")
    one_error(run_cli(tmp_path, "trace", "export", run, "--chrome", tmp_path / "plain"), "is a file")
    (tmp_path / "blocked" / "rank0_trace.json").mkdir(parents=True)  # a rank's file cannot be written
    one_error(run_cli(tmp_path, "trace", "export", run, "--chrome", tmp_path / "blocked", "--force"), "cannot write")
    assert [p.name for p in (tmp_path / "blocked").iterdir()] == ["rank0_trace.json"]  # no temporary left behind
