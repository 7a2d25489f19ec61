"""One rank's process: set up the process group and links, run the jobs, report.

:func:`worker_main` is the entry point every rank runs, whether started by
:mod:`runtime.launch` on one machine or by ``torchrun``. It owns everything a
rank has (process group, transport, stage modules, optimizer, watchdog) in one
:class:`RankContext` passed explicitly; there is no module-level state.

Failure reporting: a rank that raises writes ``failures/rank<r>-error.json``
(error, task, last decisions) before exiting; a rank whose watchdog sees no
progress for ``timeout`` seconds writes ``failures/rank<r>-stall.json`` (ready
set, inputs it still waits for, last decisions) and exits with
:data:`STALL_EXIT_CODE`. The launcher turns these files into one message
naming the root cause.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

STALL_EXIT_CODE = 75


@dataclass(frozen=True)
class Job:
    """One training job inside a launch (``rrfp run --compare`` runs two; tests run many)."""

    name: str
    config: Any  # runtime.config.RunConfig (kept picklable for spawn)
    out_dir: str
    collect_grads: bool = False
    recorder: str | None = None  # "module:Class" implementing runtime.recording.Recorder


@dataclass(frozen=True)
class WorkerOptions:
    out_root: str
    show_progress: bool = False
    timeout: float = 60.0
    threads: int | None = None  # torch intra-op threads per rank; default: cores / ranks


@dataclass
class RankContext:
    rank: int
    world: int
    local_rank: int
    device: Any
    out_root: Path
    transport: Any = None
    clock_offset_ns: int = 0  # add to local monotonic time to get rank 0's
    clock_error_ns: int = 0
    control_group: Any = None  # CPU (gloo) group for small control collectives; None: the default group
    recent: deque = field(default_factory=lambda: deque(maxlen=8))  # last decisions, for fault reports
    current: dict = field(default_factory=dict)  # job, iteration, task being run
    executor: Any = None


def worker_main(jobs: list[Job], options: WorkerOptions) -> dict[str, Any]:
    """Run ``jobs`` on this rank; returns per-job results (used by tests and the launcher)."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    out_root = Path(options.out_root)
    _redirect_output(rank, out_root)
    config = jobs[0].config
    device, backend = _device_and_backend(config, local_rank, world)
    threads = options.threads or max(1, (os.cpu_count() or 1) // max(1, world))
    torch.set_num_threads(threads)
    ctx = RankContext(rank, world, local_rank, device, out_root)
    watchdog = Watchdog(options.timeout, lambda seconds: _report_stall(ctx, seconds))
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=max(60.0, 2 * options.timeout)),
                                **({"device_id": device} if backend == "nccl" else {}))
        from runtime.transport import Transport, measure_clock_offset, pipeline_links

        if backend == "nccl":  # clock ping-pong and per-iteration timings are CPU tensors
            ctx.control_group = dist.new_group(backend="gloo")
        ctx.clock_offset_ns, ctx.clock_error_ns = measure_clock_offset(rank, world, group=ctx.control_group)
        links = pipeline_links([pair for job in jobs for pair in _job_graph(job.config).links()])
        ctx.transport = Transport(rank, links, device, options.timeout, latency=None)
        ctx.transport.start(timeout=options.timeout)
        dist.barrier()
        watchdog.start()
        results = {}
        for job in jobs:
            results[job.name] = _run_job(ctx, job, options, watchdog)
        watchdog.stop()
        ctx.transport.close()
        dist.barrier()
        return results
    except BaseException as err:
        watchdog.stop()
        _report_error(ctx, err)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _job_graph(config):
    """The dependency graph of a job's shape (the links come from it, as every message does)."""
    from runtime.deps import TaskGraph
    from runtime.plan import run_shape

    return TaskGraph.build(run_shape(config))


def _device_and_backend(config, local_rank: int, world: int):
    """``auto``: CUDA when present. NCCL needs one GPU per rank; with fewer GPUs, gloo stages through the host."""
    import torch

    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but CUDA is not available")
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if use_cuda and torch.cuda.device_count() >= world else "gloo"
    return device, backend


def _redirect_output(rank: int, out_root: Path) -> None:
    """Ranks other than 0 write stdout/stderr (Python and C level) to ``logs/rank<r>.log``."""
    if rank == 0:
        return
    logs = out_root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    handle = open(logs / f"rank{rank}.log", "a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(handle.fileno(), 1)
    os.dup2(handle.fileno(), 2)
    sys.stdout = sys.stderr = handle


def _run_job(ctx: RankContext, job: Job, options: WorkerOptions, watchdog: "Watchdog") -> dict[str, Any]:
    from runtime.arbiter import MemoryBudget, make_arbiter
    from runtime.deps import TaskGraph
    from runtime.executor import StageExecutor
    from runtime.plan import HintPlan, run_shape
    from runtime.recording import ListRecorder, NullRecorder, RecorderSetup, load_recorder_class
    from runtime.workloads import make_optimizer, make_workload

    config = job.config
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The launcher validated the job (hint, budget, completion) before any rank started.
    workload = make_workload(config, run_shape(config), ctx.device)
    plan = HintPlan(config, workload)
    shape = plan.for_iteration(0).shape  # the hint decides whether backwards are split
    graph = TaskGraph.build(shape)
    rule = config.rule()
    budgets = MemoryBudget.parse(config.memory_budget).per_rank(shape) if rule.uses_budget else None
    modules = {stage: workload.build_stage(stage).to(ctx.device) for stage in shape.stages_of_rank(ctx.rank)}
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = make_optimizer(params, config)
    if job.recorder:
        setup = RecorderSetup(ctx.rank, ctx.world, str(out_dir), job.name, config, ctx.device, ctx.clock_offset_ns,
                              ctx.clock_error_ns, budgets[ctx.rank] if budgets else None)
        recorder = load_recorder_class(job.recorder)(setup)
    else:  # tests (collect_grads) check budgets from every decision; a plain run keeps nothing
        recorder = ListRecorder() if job.collect_grads else NullRecorder()
    noise = _Injector(config, ctx.rank, workload)
    ctx.transport.latency = noise.latency
    executor = StageExecutor(
        ctx.rank, graph, workload, modules, ctx.transport, ctx.device, recorder=_Tracking(recorder, ctx),
        delay=noise.extra, fail_at=config.fault("fail_at"), hang_at=config.fault("hang_at"),
        progress=watchdog.progress, lookahead=rule.lookahead,
    )
    ctx.executor = executor
    bar = _ProgressBar(job, config) if ctx.rank == 0 and options.show_progress else None
    rows, losses, first = [], [], {}
    try:
        for iteration in range(config.iters):
            ctx.current = {"job": job.name, "iteration": iteration}
            hint = plan.for_iteration(iteration)
            arbiter = make_arbiter(rule, graph, ctx.rank, hint.orders[ctx.rank],
                                   budgets[ctx.rank] if budgets else None, record=True,
                                   estimates=executor.forecast.estimates if executor.forecast else None)
            began = time.perf_counter()
            result = executor.run_iteration(iteration, arbiter)
            if iteration == 0:
                first = {"executed": [str(t) for t in result.executed], "peak_in_flight": result.peak_in_flight,
                         "budget": budgets[ctx.rank] if budgets else None}
                if job.collect_grads:
                    first["grads"] = {f"{stage}.{name}": p.grad.detach().cpu().clone()
                                      for stage, m in modules.items() for name, p in m.named_parameters()
                                      if p.grad is not None}
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            watchdog.progress()
            gathered = _gather_summaries(ctx.world, result, ctx.control_group)  # also the barrier between iterations
            watchdog.progress()
            wall = time.perf_counter() - began
            row = _metrics_row(iteration, gathered, wall, workload.unit)
            rows.append(row)
            losses.append(row["loss"])
            if bar:
                bar.update(row)
    finally:
        if bar:
            bar.close()
        recorder.close()
    if ctx.rank == 0:
        _write_outputs(out_dir, config, rows, workload)
    if isinstance(recorder, ListRecorder):
        first["max_decision_in_flight"] = max((d.in_flight for _, d in recorder.decisions), default=0)
    return {**first, "losses": losses, "metrics": rows if ctx.rank == 0 else None}


def _gather_summaries(world: int, result, group) -> list[dict[str, Any]]:
    """Every rank's iteration summary (tensor collectives: the object ones need numpy)."""
    import torch
    import torch.distributed as dist

    counts = torch.tensor([result.start_ns, result.end_ns, result.busy_ns, result.units, result.peak_in_flight],
                          dtype=torch.int64)
    loss = torch.tensor([float("nan") if result.loss is None else result.loss], dtype=torch.float64)
    all_counts = [torch.empty_like(counts) for _ in range(world)]
    all_losses = [torch.empty_like(loss) for _ in range(world)]
    dist.all_gather(all_counts, counts, group=group)
    dist.all_gather(all_losses, loss, group=group)
    summaries = []
    for rank, (c, l) in enumerate(zip(all_counts, all_losses)):
        start_ns, end_ns, busy_ns, units, peak = c.tolist()
        value = l.item()
        summaries.append({"rank": rank, "start_ns": start_ns, "end_ns": end_ns, "busy_ns": busy_ns, "units": units,
                          "peak_in_flight": peak, "loss": None if value != value else value})
    return summaries


def _metrics_row(iteration: int, gathered: list[dict], wall: float, unit: str) -> dict[str, Any]:
    start = min(g["start_ns"] for g in gathered)
    end = max(g["end_ns"] for g in gathered)
    makespan = max(end - start, 1) * 1e-9
    loss = next((g["loss"] for g in gathered if g["loss"] is not None), None)
    units = sum(g["units"] for g in gathered)
    return {
        "iteration": iteration,
        "loss": loss,
        "wall_seconds": wall,
        "makespan_seconds": makespan,
        "throughput": units / wall if wall > 0 else 0.0,
        "unit": f"{unit}/s",
        "busy_seconds": [g["busy_ns"] * 1e-9 for g in gathered],
        "idle_fraction": [max(0.0, 1.0 - g["busy_ns"] * 1e-9 / makespan) for g in gathered],
        "peak_in_flight": [g["peak_in_flight"] for g in gathered],
    }


def _write_outputs(out_dir: Path, config, rows: list[dict], workload) -> None:
    import polars as pl

    (out_dir / "config.json").write_text(json.dumps(config.to_json(), indent=1) + "\n")
    pl.DataFrame(rows).write_parquet(out_dir / "metrics.parquet")
    if workload.name == "emulated":
        from runtime.duration_tables import durations_frame_rows

        records = [(iteration, *row) for iteration in range(config.iters)
                   for row in durations_frame_rows(workload.durations(iteration))]
        pl.DataFrame(records, schema=["iteration", "stage", "kind", "microbatch", "duration"],
                     orient="row").write_parquet(out_dir / "durations.parquet")


class _Injector:
    """Variability injected into real workloads (sleep after compute) and per-message latency.

    The emulated workload's sampled durations already contain jitter and
    stragglers, so there only ``--delay`` is added; its transfers take the
    sampled latencies. Real workloads draw jitter, stragglers and latency
    from the same model, seeded per rank.
    """

    def __init__(self, config, rank: int, workload) -> None:
        import random

        from runtime.workloads import mix_seed

        self.config, self.workload = config, workload
        self.delays = config.delays_by_task()
        self.rng = random.Random(mix_seed(config.seed, 104729, rank))
        self.emulated = workload.name == "emulated"
        self.iteration = 0

    def extra(self, iteration: int, task, elapsed: float) -> float:
        self.iteration = iteration
        extra = self.delays.get(task, 0.0)
        if self.emulated:
            return extra
        c = self.config
        factor = 1.0
        if c.jitter > 0:
            factor *= self.rng.lognormvariate(-c.jitter * c.jitter / 2, c.jitter)
        if c.straggler_prob > 0 and self.rng.random() < c.straggler_prob:
            factor *= c.straggler_slowdown
        return extra + max(0.0, elapsed * (factor - 1.0))

    def latency(self, dst: int, producer) -> float:
        if self.emulated:
            table = self.workload.durations(self.iteration)
            sends = table.send_forward if producer.kind.value == "F" else table.send_backward
            return sends[producer.stage][producer.microbatch]
        c = self.config
        if c.comm_latency <= 0:
            return 0.0
        if c.comm_jitter > 0:
            return c.comm_latency * self.rng.lognormvariate(-c.comm_jitter ** 2 / 2, c.comm_jitter)
        return c.comm_latency


class _Tracking:
    """Recorder wrapper that also keeps what a fault report needs (current task, recent decisions)."""

    def __init__(self, inner, ctx: RankContext) -> None:
        self.inner, self.ctx = inner, ctx

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decision(self, iteration, decision, wait_ns):
        self.ctx.recent.append(f"it{iteration} t={decision.time:.6f} ran {decision.chosen}"
                               + (f" (skipped {decision.head})" if decision.head else "")
                               + f" ready={[str(t) for t, _ in decision.ready][:8]}")
        self.inner.decision(iteration, decision, wait_ns)

    def task_started(self, iteration, task, now_ns):
        self.ctx.current["task"] = str(task)
        self.inner.task_started(iteration, task, now_ns)

    def task_finished(self, span):
        self.ctx.current.pop("task", None)
        self.inner.task_finished(span)


class Watchdog:
    """Reports a stall when nothing progressed for ``timeout`` seconds, then ends the process.

    Every stalled rank writes its report at the same moment; a rank stuck
    *inside* a task (the likely root cause) exits one second later, an idle
    rank (waiting on others) only after a further grace period, so the root
    cause exits first and the others' reports are already on disk when the
    launcher stops them.
    """

    def __init__(self, timeout: float, report) -> None:
        self.timeout, self.report = timeout, report  # report(seconds) -> True if stuck inside a task
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rrfp-watchdog", daemon=True)

    def start(self) -> None:
        self.last = time.monotonic()
        self._thread.start()

    def progress(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        exit_at = None
        while not self._stop.wait(min(0.5, self.timeout / 4)):
            now = time.monotonic()
            silent = now - self.last
            if silent <= self.timeout:
                exit_at = None  # progress resumed after a report
            elif exit_at is None:
                in_task = self.report(silent)
                exit_at = now + (1.0 if in_task else max(2.0, self.timeout / 2))
            elif now >= exit_at:
                os._exit(STALL_EXIT_CODE)


def _failure_path(ctx: RankContext, kind: str) -> Path:
    folder = ctx.out_root / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"rank{ctx.rank}-{kind}.json"


def _report_stall(ctx: RankContext, seconds: float) -> bool:
    report: dict[str, Any] = {"rank": ctx.rank, "kind": "stall", "time": time.time(),
                              "seconds_without_progress": seconds, **ctx.current,
                              "recent_decisions": list(ctx.recent)}
    executor = ctx.executor
    if executor is not None and executor.arbiter is not None:
        arbiter = executor.arbiter
        report["ready"] = [str(t) for t in arbiter.ready_tasks()]
        report["waiting_for"] = [f"{task} needs {', '.join(map(str, needs))}"
                                 for task, needs in arbiter.waiting_on()[:8]]
    _failure_path(ctx, "stall").write_text(json.dumps(report, indent=1))
    return "task" in ctx.current


def _report_error(ctx: RankContext, err: BaseException) -> None:
    from runtime.transport import TransportError

    report = {"rank": ctx.rank, "kind": "transport" if isinstance(err, TransportError) else "error",
              "time": time.time(), "error": f"{type(err).__name__}: {err}", **ctx.current,
              "recent_decisions": list(ctx.recent), "traceback": traceback.format_exc()}
    try:
        _failure_path(ctx, "error").write_text(json.dumps(report, indent=1))
    except OSError:
        pass


class _ProgressBar:
    """Rank 0's rich progress bar: iterations, loss, throughput (stderr)."""

    def __init__(self, job: Job, config) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn(f"[bold]{job.name}[/] -> {job.out_dir}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
        self.progress.start()
        self.task = self.progress.add_task(job.name, total=config.iters, status="")

    def update(self, row: dict) -> None:
        loss = "-" if row["loss"] is None else f"{row['loss']:.4f}"
        self.progress.update(self.task, advance=1,
                             status=f"loss {loss}  {row['throughput']:,.0f} {row['unit']}")

    def close(self) -> None:
        self.progress.stop()
