"""One rank's process: set up the process group and links, run the jobs, report.

:func:`worker_main` is the entry point every rank runs, whether started by
:mod:`runtime.run.launch` on one machine or by ``torchrun``. It owns everything a
rank has (process group, transport, stage modules, optimizer, watchdog) in one
:class:`RankContext` passed explicitly; there is no module-level state.

Failure reporting: a rank that raises writes ``failures/rank<r>-error.json``
(error, task, last decisions) before exiting; a rank whose watchdog sees no
progress for ``timeout`` seconds within an iteration writes
``failures/rank<r>-stall.json`` (ready set, inputs it still waits for, last
decisions) and exits with :data:`STALL_EXIT_CODE`, unless progress resumes
first, which withdraws the report. A rank killed outright writes nothing, so
every rank also keeps where it is (job, iteration, task) in
``status/rank<r>``, a small memory-mapped file that outlives the process
(:class:`StatusBoard`). The launcher turns these files into one message
naming the root cause.

SIGINT and SIGTERM raise :class:`hints.errors.Interrupted` in the main
thread: the rank writes an ``interrupt`` report, closes its trace recorder
(every completed iteration is on disk) and stops.

Outputs are written as the job goes, so a failure keeps what finished:
``config.json`` (and an emulated job's ``durations.parquet``) before the first
iteration, one line of ``metrics.jsonl`` per iteration as it ends (rank 0),
and ``metrics.parquet`` from those lines at the end, or by the launcher
(:func:`salvage_metrics`) after a failure or an interrupt.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
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
    recorder: str | None = None  # "module:Class" implementing runtime.exec.recording.Recorder
    resume: str | None = None  # a checkpoint directory (runtime.run.checkpoint) to start from


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
    status: "StatusBoard | None" = None  # where this rank is, for the launcher if the rank is killed
    grid: Any = None  # runtime.comm.grid.ProcessGrid: this rank's pipeline, TP and DP coordinates
    groups: Any = None  # runtime.comm.grid.GridGroups: its TP and DP process groups


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
    if threading.current_thread() is threading.main_thread():
        from hints.errors import raise_interrupted

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, raise_interrupted)
    config = jobs[0].config
    threads = options.threads or max(1, (os.cpu_count() or 1) // max(1, world))
    torch.set_num_threads(threads)
    ctx = RankContext(rank, world, local_rank, torch.device("cpu"), out_root,
                      status=StatusBoard(out_root / "status" / f"rank{rank}"))
    watchdog = Watchdog(options.timeout, lambda seconds: _report_stall(ctx, seconds),
                        lambda: _failure_path(ctx, "stall").unlink(missing_ok=True))
    try:
        ctx.device, backend = _device_and_backend(config, local_rank, world)
        group_timeout = timedelta(seconds=max(60.0, 2 * options.timeout))
        dist.init_process_group(backend, timeout=group_timeout, **_attempt_store(rank, world, group_timeout),
                                **({"device_id": ctx.device} if backend == "nccl" else {}))
        from runtime.comm.grid import ProcessGrid, make_groups
        from runtime.comm.transport import Transport, measure_clock_offset

        if backend == "nccl":  # clock ping-pong and per-iteration timings are CPU tensors
            ctx.control_group = dist.new_group(backend="gloo")
        measured = measure_clock_offset(rank, world, group=ctx.control_group)
        ctx.clock_offset_ns, ctx.clock_error_ns = _clock_domain(measured, ctx.control_group)
        ctx.grid = ProcessGrid.of(config, rank)
        links = ctx.grid.links([pair for job in jobs for pair in _job_links(job.config)])
        _log_links(ctx, backend, links)
        ctx.transport = Transport(rank, links, ctx.device, options.timeout, latency=None)
        ctx.groups = make_groups(ctx.grid, timedelta(seconds=max(60.0, 2 * options.timeout)))
        ctx.transport.start(timeout=options.timeout)
        dist.barrier()
        watchdog.start()
        results = {}
        for job in jobs:
            results[job.name] = _run_job(ctx, job, options, watchdog)
        watchdog.stop()
        ctx.transport.close()
        dist.barrier()
        ctx.status.finished()
        return results
    except BaseException as err:
        watchdog.stop()
        _report_error(ctx, err)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _attempt_store(rank: int, world: int, timeout) -> dict[str, Any]:
    """Under ``torchrun``'s agent store, a store of this restart attempt's own (``init_process_group`` kwargs).

    [Note: restarted ranks and the agent's store] With ``torchrun
    --max-restarts`` and its default static rendezvous, every attempt's ranks
    share one TCPStore hosted by the agent, and torch prefixes nothing per
    attempt. A restarted rank could then read the previous attempt's gloo
    addresses (whichever rank writes its key last reads the others' stale
    ones) and fail with "connection refused" or hang. Prefixing the store
    with ``TORCHELASTIC_RESTART_COUNT`` gives each attempt its own keys.
    Outside torchrun's agent store: no kwargs (the default ``env://``).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    import torch.distributed as dist

    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"rrfp/attempt_{attempt}", agent), "rank": rank, "world_size": world}


def _clock_domain(measured: tuple[int, int], group) -> tuple[int, int]:
    """The offset to rank 0's clock that this rank applies, and its error bound.

    [Note: one clock domain] Ranks on one host read the same monotonic clock
    (same kernel boot: ``/proc/sys/kernel/random/boot_id``), so their offset
    is exactly 0: applying the ping-pong's estimate there would only add its
    error, and make messages arrive before they were sent. Across hosts the
    measured offset is applied only when it exceeds its error bound. A
    collective: every rank calls it.
    """
    import torch
    import torch.distributed as dist

    mine = torch.tensor([_boot_id()], dtype=torch.int64)
    boots = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(boots, mine, group=group)
    return choose_clock_offset(measured, mine.item(), boots[0].item())


def choose_clock_offset(measured: tuple[int, int], boot: int, rank0_boot: int) -> tuple[int, int]:
    """[Note: one clock domain] for one rank: its measured ``(offset, error)``, its boot and rank 0's."""
    offset, error = measured
    if boot != 0 and boot == rank0_boot:
        return 0, 0
    return (offset if abs(offset) > error else 0), error


def _boot_id() -> int:
    """This host's boot, as a 63-bit number (0 if unknown: then offsets are measured as across hosts)."""
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return int(text.replace("-", ""), 16) >> 65 or 1
    except (OSError, ValueError):
        return 0


def _job_graph(config):
    """The dependency graph of a job's shape (the links come from it, as every message does)."""
    from hints.deps import TaskGraph
    from runtime.config import run_shape

    return TaskGraph.build(run_shape(config))


def _job_links(config) -> set[tuple[int, int]]:
    """The ``(producer rank, consumer rank)`` pairs a job's messages cross; with ``--p2p blocking`` also each
    reversed, for the POSTED frames ([Note: blocking p2p in the runtime] in runtime.exec.executor)."""
    links = _job_graph(config).links()
    return links | {(b, a) for a, b in links} if config.p2p == "blocking" else links


def _device_and_backend(config, local_rank: int, world: int):
    """``auto``: CUDA when present. NCCL needs one GPU per rank *of this node* (``LOCAL_WORLD_SIZE``, so
    multi-node torchrun jobs get NCCL too); with fewer GPUs, gloo stages through the host."""
    import torch

    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but CUDA is not available")
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = config.backend
    if backend == "auto":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        backend = "nccl" if use_cuda and torch.cuda.device_count() >= local_world else "gloo"
    return device, backend


def _link_wire(backend: str) -> str:
    """What a pipeline link runs over ([Note: dispatcher reads the sockets] in runtime.comm.transport)."""
    if backend != "gloo":
        return backend
    from runtime.comm.transport import BODY_BYTES

    return f"a TCP connection each (frames, payloads up to {BODY_BYTES >> 20} MiB) and gloo (larger payloads)"


def _log_links(ctx: RankContext, backend: str, links) -> None:
    """One line per rank in ``logs/run.log``: its device and what each of its links runs over."""
    peers = sorted({peer for pair in links for peer in pair if ctx.rank in pair and peer != ctx.rank})
    control = "gloo" if ctx.control_group is not None else backend
    where = f" ({ctx.grid.describe()})" if ctx.grid.world > ctx.grid.pp else ""
    line = (f"rank {ctx.rank}{where} (local {ctx.local_rank}): device {ctx.device}; links to "
            f"{', '.join(f'rank {p}' for p in peers) or 'no rank'} over {_link_wire(backend)}; control collectives over "
            f"{control}\n")
    logs = ctx.out_root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "run.log", "a") as handle:  # one short append per rank: lines do not interleave
        handle.write(line)


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
    from runtime.sched.budget import MemoryBudget
    from runtime.sched.rules import make_arbiter
    from hints.deps import TaskGraph
    from runtime.exec.executor import StageExecutor
    from runtime.comm.grid import SliceTransport
    from runtime.config import run_shape
    from runtime.run.plan import HintPlan
    from runtime.exec.recording import ListRecorder, NullRecorder, RecorderSetup, load_recorder_class
    from runtime.exec.tp_follow import member_arbiter
    from runtime.workloads.make import make_optimizer, make_workload

    config = job.config
    grid = ctx.grid
    pipe = grid.pipe_rank  # the pipeline's rank: hint orders, budgets, arbiters and the executor use it
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The launcher validated the job (hint, budget, completion) before any rank started.
    workload = make_workload(config, run_shape(config), ctx.device, replica=grid.dp_rank)
    workload.prepare(run_shape(config).stages_of_rank(pipe))
    if ctx.rank == 0:
        _write_job_inputs(out_dir, config, workload)
    plan = HintPlan(config, workload)
    shape = plan.for_iteration(0).shape  # the hint decides whether backwards are split
    workload.split_backward = shape.split_backward
    graph = TaskGraph.build(shape)
    rule = config.rule()
    budgets = MemoryBudget.parse(config.memory_budget).per_rank(shape) if rule.uses_budget else None
    modules = _stage_modules(ctx, workload, shape.stages_of_rank(pipe))
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = make_optimizer(params, config)
    noise = _Injector(config, ctx.rank, workload)
    _seed_rank(config, pipe)  # the pipeline rank: a TP group draws alike (pipe == rank without --tp/--dp)
    checkpointer, start = _restore(ctx, job, workload, modules, optimizer, noise)
    if job.recorder:
        setup = RecorderSetup(ctx.rank, ctx.world, str(out_dir), job.name, config, ctx.device, ctx.clock_offset_ns,
                              ctx.clock_error_ns, budgets[pipe] if budgets else None, grid)
        recorder = load_recorder_class(job.recorder)(setup)
    else:  # tests (collect_grads) check budgets from every decision; a plain run keeps nothing
        recorder = ListRecorder() if job.collect_grads else NullRecorder()
    ctx.transport.latency = noise.latency
    executor = StageExecutor(
        pipe, graph, workload, modules, SliceTransport(ctx.transport, grid), ctx.device,
        recorder=_Tracking(recorder, ctx), progress=watchdog.progress, lookahead=rule.lookahead and grid.is_leader,
        blocking=config.p2p == "blocking",
    )
    ctx.executor = executor
    reducer = _gradient_reducer(ctx, modules, shape, executor)
    _install_injections(executor, config, noise)
    bar = _ProgressBar(job, config) if ctx.rank == 0 and options.show_progress else None
    rows, losses, first = [], [], {}
    metrics = MetricsLog(out_dir, resume_at=start) if ctx.rank == 0 else None
    try:
        for iteration in range(start, config.iters):
            ctx.current = {"job": job.name, "iteration": iteration}
            ctx.status.iteration(job.name, iteration)
            watchdog.arm()  # per iteration: set-up (model, workload) may take long on a loaded machine
            hint = plan.for_iteration(iteration)
            arbiter = member_arbiter(
                grid, lambda: make_arbiter(rule, graph, pipe, hint.orders[pipe], budgets[pipe] if budgets else None,
                                           record=True,
                                           estimates=executor.forecast.estimates if executor.forecast else None),
                graph, hint.orders[pipe], ctx.transport, iteration, ctx.clock_offset_ns)
            began = time.perf_counter()
            if reducer:
                reducer.begin_iteration()
            result = executor.run_iteration(iteration, arbiter)
            reduced = reducer.finish() if reducer else None
            if not grid.is_leader:  # the group's loss and units are counted once, by its leader
                result.loss, result.units = None, 0
            if iteration == 0:
                first = {"executed": [str(t) for t in result.executed], "peak_in_flight": result.peak_in_flight,
                         "budget": budgets[pipe] if budgets else None, "grid": grid}
                if job.collect_grads:
                    first["grads"] = {f"{stage}.{name}": p.grad.detach().cpu().clone()
                                      for stage, m in modules.items() for name, p in m.named_parameters()
                                      if p.grad is not None}
                    first["sharded"] = _sharded_layouts(modules)
            step_began = time.monotonic_ns()
            stepped = _step_allowed(ctx, config, result, iteration)
            if stepped:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if job.collect_grads:  # tests: replicas must hold identical parameters after every step
                first.setdefault("params", []).append(
                    {f"{stage}.{name}": p.detach().cpu().clone() for stage, m in modules.items()
                     for name, p in m.named_parameters()})
            watchdog.progress()
            if ctx.device.type == "cuda" and config.traces(iteration):
                import torch

                torch.cuda.synchronize()  # the step's kernels in its span, not in the barrier's
            barrier_began = time.monotonic_ns()
            # also the barrier between iterations; times on rank 0's clock, so makespans compare across ranks
            gathered = _gather_summaries(ctx.world, result, ctx.control_group, ctx.clock_offset_ns, reduced)
            recorder.optimizer_step(iteration, step_began, barrier_began, time.monotonic_ns())
            watchdog.disarm()
            wall = time.perf_counter() - began
            row = _metrics_row(iteration, gathered, wall, workload.unit, with_reduce=reducer is not None)
            if config.skip_nonfinite:
                row["skipped_step"] = not stepped
            if checkpointer is not None:  # a collective, after the barrier above; its row follows it
                row["checkpoint_seconds"] = checkpointer.save_if_due(iteration + 1, config)
            rows.append(row)
            losses.append(row["loss"])
            if metrics:
                metrics.append(row)
            if bar:
                bar.update(row)
    finally:
        watchdog.disarm()
        if bar:
            bar.close()
        recorder.close()
    if metrics:
        metrics.close()
    if isinstance(recorder, ListRecorder):
        first["max_decision_in_flight"] = max((d.in_flight for _, d in recorder.decisions), default=0)
        first["rendezvous_waits"] = len(recorder.waits)  # [Note: blocking p2p in the runtime]
    return {**first, "losses": losses, "metrics": rows if ctx.rank == 0 else None}


class NonFiniteLoss(RuntimeError):
    """The loss was NaN or infinite (the run stops before the optimizer step; see :func:`_step_allowed`)."""


def _step_allowed(ctx: RankContext, config, result, iteration: int) -> bool:
    """Whether this iteration's optimizer step may run: no when its loss was NaN or infinite.

    [Note: non-finite losses] The loss is known on the rank of the last stage
    only. By default that rank raises :class:`NonFiniteLoss` here, before
    the end-of-iteration all-gather: no rank gets past that barrier, so no
    checkpoint is written after the bad step ([Note: atomic checkpoints] in
    :mod:`runtime.run.checkpoint`) and the launcher names this error as the root
    cause. With ``--skip-nonfinite`` every rank learns it from one small
    all-reduce and skips the step (the gradients are dropped, the optimizer's
    state is untouched), and the metrics row says ``skipped_step``.
    """
    import math

    bad = result.loss is not None and not math.isfinite(result.loss)
    if not config.skip_nonfinite:
        if bad:
            raise NonFiniteLoss(f"the loss is {result.loss} at iteration {iteration}; stopped before the optimizer "
                                f"step, so no checkpoint holds it (--skip-nonfinite skips such steps instead)")
        return True
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if bad else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.control_group)
    return flag.item() == 0.0


def _seed_rank(config, rank: int) -> None:
    """Seed this rank's global torch and Python RNGs from ``(--seed, rank)`` as a job starts.

    torch seeds a new process's generator at random, so without this a model that draws from it
    (dropout in a user's model) would train differently on every run, and a checkpoint's RNG states
    would restore a stream no other run could reproduce.
    """
    import random

    import torch

    from runtime.workloads.base import mix_seed

    seed = mix_seed(config.seed, 15485863, rank)
    torch.manual_seed(seed)
    random.seed(seed)


def _restore(ctx: RankContext, job: Job, workload, modules: dict, optimizer, noise: "_Injector"):
    """This job's checkpointer (None when it neither writes nor resumes) and the iteration it starts at.

    Resuming loads model, optimizer and RNG states (a collective), moves the data to the checkpoint's
    position, and sets this rank's trace of the earlier attempt aside (``trace-before-step-<N>/``) so
    the new trace covers the resumed iterations only.
    """
    config = job.config
    if not config.checkpoint_every and not job.resume:
        return None, 0
    from runtime.run.checkpoint import RankCheckpointer, TPSharding

    sharding = (TPSharding(_sharded_layouts(modules, "stage"), ctx.groups.tp,
                           ctx.grid.tp, ctx.device.type) if ctx.grid.tp > 1 else None)
    checkpointer = RankCheckpointer(job.out_dir, ctx.rank, modules, optimizer, {"noise": noise.rng},
                                    ctx.control_group, sharding)
    checkpointer.clear_partial()
    if not job.resume:
        return checkpointer, 0
    start = checkpointer.load(Path(job.resume))
    workload.resume_at(start)
    out_dir = Path(job.out_dir)
    aside = out_dir / f"trace-before-step-{start}"
    for old in ([out_dir / "trace" / f"rank{ctx.rank}.pftrace"]
                + ([out_dir / "trace.pftrace"] if ctx.rank == 0 else [])):
        if old.exists():
            aside.mkdir(exist_ok=True)
            old.replace(aside / old.name)
    return (checkpointer if config.checkpoint_every else None), start


def _stage_modules(ctx: RankContext, workload, stages) -> dict:
    """This rank's stage modules: whole, or with ``--tp`` its shard of each ([Note: TP coordination])."""
    modules = {stage: workload.build_stage(stage) for stage in stages}
    if ctx.grid.tp > 1:
        from runtime.workloads.tp_layers import shard_stage, TPShard

        shard = TPShard(ctx.grid.tp_rank, ctx.grid.tp, ctx.groups.tp)
        modules = {stage: shard_stage(module, shard) for stage, module in modules.items()}
    return {stage: module.to(ctx.device) for stage, module in modules.items()}


def _sharded_layouts(modules: dict, prefix: str = "") -> dict:
    """``{"<prefix><stage>.<parameter>": layout}`` of this rank's sharded parameters."""
    from runtime.workloads.tp_layers import sharded_layouts

    return {f"{prefix}{stage}.{name}": layout for stage, m in modules.items() for name, layout in sharded_layouts(m).items()}


def _gradient_reducer(ctx: RankContext, modules: dict, shape, executor):
    """With ``--dp``: the reducer that averages this rank's gradients over the replicas (None without)."""
    if ctx.grid.dp == 1:
        return None
    from runtime.run.dp import GradientReducer

    reducer = GradientReducer(modules, ctx.groups.dp, ctx.grid.dp, shape.microbatches)
    reducer.install(executor.handlers, shape.split_backward)
    return reducer


def _install_injections(executor, config, noise) -> None:
    """Wrap every handler with the injected delays (``--delay``, noise on real workloads) and, when asked for,
    the injected faults (``--fail-at``, ``--hang-at``).

    Installed after data parallelism's wrapper and in this order, so a task runs: the fault check, its
    computation (and the reducer's count), then the sleep.
    """
    from runtime.exec.handlers import delay_after, inject_faults

    executor.handlers.wrap(delay_after(noise.extra), "delay")
    fail_at, hang_at = config.fault("fail_at"), config.fault("hang_at")
    if fail_at is not None or hang_at is not None:
        executor.handlers.wrap(inject_faults(fail_at, hang_at), "fault")


def _gather_summaries(world: int, result, group, clock_offset_ns: int = 0, reduced=None) -> list[dict[str, Any]]:
    """Every rank's iteration summary (tensor collectives: the object ones need numpy); start and end on
    rank 0's clock. ``reduced``: this rank's data-parallel reduction (:class:`runtime.run.dp.ReduceStats`)."""
    import torch
    import torch.distributed as dist

    counts = torch.tensor([result.start_ns + clock_offset_ns, result.end_ns + clock_offset_ns, result.busy_ns,
                           result.units, result.peak_in_flight, reduced.reduce_ns if reduced else 0,
                           reduced.exposed_ns if reduced else 0], dtype=torch.int64)
    loss = torch.tensor([float("nan") if result.loss is None else result.loss], dtype=torch.float64)
    all_counts = [torch.empty_like(counts) for _ in range(world)]
    all_losses = [torch.empty_like(loss) for _ in range(world)]
    dist.all_gather(all_counts, counts, group=group)
    dist.all_gather(all_losses, loss, group=group)
    summaries = []
    for rank, (c, l) in enumerate(zip(all_counts, all_losses)):
        start_ns, end_ns, busy_ns, units, peak, reduce_ns, exposed_ns = c.tolist()
        value = l.item()
        summaries.append({"rank": rank, "start_ns": start_ns, "end_ns": end_ns, "busy_ns": busy_ns, "units": units,
                          "peak_in_flight": peak, "loss": None if value != value else value,
                          "reduce_ns": reduce_ns, "exposed_ns": exposed_ns})
    return summaries


def _metrics_row(iteration: int, gathered: list[dict], wall: float, unit: str,
                 with_reduce: bool = False) -> dict[str, Any]:
    """One line of ``metrics.jsonl``; per-rank lists are indexed by global rank. The loss is the mean over
    the data-parallel replicas (one last-stage leader each: the loss of the whole batch)."""
    start = min(g["start_ns"] for g in gathered)
    end = max(g["end_ns"] for g in gathered)
    makespan = max(end - start, 1) * 1e-9
    losses = [g["loss"] for g in gathered if g["loss"] is not None]
    loss = sum(losses) / len(losses) if losses else None
    units = sum(g["units"] for g in gathered)
    reduce = {"dp_reduce_seconds": [g["reduce_ns"] * 1e-9 for g in gathered],
              "dp_exposed_seconds": [g["exposed_ns"] * 1e-9 for g in gathered]} if with_reduce else {}
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
        **reduce,
    }


def _write_job_inputs(out_dir: Path, config, workload) -> None:
    """Before the first iteration: ``config.json`` and, for the emulated workload, every iteration's sampled
    durations (known up front), so a run that fails keeps what it was."""
    (out_dir / "config.json").write_text(json.dumps(config.to_json(), indent=1) + "\n")
    if workload.name == "emulated":
        import polars as pl

        from runtime.durations.tables import durations_frame_rows

        records = [(iteration, *row) for iteration in range(config.iters)
                   for row in durations_frame_rows(workload.durations(iteration))]
        pl.DataFrame(records, schema=["iteration", "stage", "kind", "microbatch", "duration"],
                     orient="row").write_parquet(out_dir / "durations.parquet")


METRICS_LOG = "metrics.jsonl"


class MetricsLog:
    """Rank 0's per-iteration metrics: a JSON line appended (and flushed) as each iteration ends, turned into
    ``metrics.parquet`` at the end, or by :func:`salvage_metrics` after a failure or an interrupt."""

    def __init__(self, out_dir: Path, resume_at: int = 0) -> None:
        self.out_dir = out_dir
        kept = _rows_before(out_dir, resume_at) if resume_at else []  # a resumed run keeps the iterations before
        self.handle = open(out_dir / METRICS_LOG, "w")
        for row in kept:
            self.append(row)

    def append(self, row: dict[str, Any]) -> None:
        self.handle.write(json.dumps(row) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()
        salvage_metrics(self.out_dir)


def _rows_before(out_dir: Path, iteration: int) -> list[dict[str, Any]]:
    """The metrics rows of iterations before ``iteration`` that an earlier attempt left in ``out_dir``."""
    salvage_metrics(out_dir)  # an attempt that was killed may have left only metrics.jsonl
    path = Path(out_dir) / "metrics.parquet"
    if not path.exists():
        return []
    import polars as pl

    return [row for row in pl.read_parquet(path).to_dicts() if row["iteration"] < iteration]


def salvage_metrics(out_dir: Path) -> int:
    """Turn ``metrics.jsonl`` into ``metrics.parquet`` (complete lines only); returns how many iterations.

    Returns 0, writing nothing, when there is no log or no complete line.
    """
    path = Path(out_dir) / METRICS_LOG
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill: everything before it is whole
            break
    if rows:
        import polars as pl

        partial = path.with_suffix(".parquet.partial")
        pl.DataFrame(rows).write_parquet(partial)
        partial.replace(Path(out_dir) / "metrics.parquet")
    path.unlink()
    return len(rows)


class _Injector:
    """Variability injected into real workloads (sleep after compute) and per-message latency.

    The emulated workload's sampled durations already contain jitter and
    stragglers, so there only ``--delay`` is added; its transfers take the
    sampled latencies. Real workloads draw jitter, stragglers and latency
    from the same model, seeded per rank.
    """

    def __init__(self, config, rank: int, workload) -> None:
        import random

        from runtime.workloads.base import mix_seed

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
        self.ctx.current["task"] = text = str(task)
        self.ctx.status.running(text)
        self.inner.task_started(iteration, task, now_ns)

    def task_finished(self, span):
        self.ctx.current.pop("task", None)
        self.ctx.status.idle()
        self.inner.task_finished(span)


class Watchdog:
    """Reports a stall when nothing progressed for ``timeout`` seconds of an iteration, then ends the process.

    Armed only while an iteration runs (:meth:`arm` / :meth:`disarm`), so
    per-job set-up on a loaded machine is never taken for a stall. Every
    stalled rank writes its report at the same moment; a rank stuck *inside*
    a task (the likely root cause) exits one second later, an idle rank
    (waiting on others) only after a further grace period, so the root cause
    exits first and the others' reports are already on disk when the
    launcher stops them. If progress resumes before the exit, the report is
    withdrawn, so a later failure is never blamed on a stale stall.
    """

    def __init__(self, timeout: float, report, withdraw) -> None:
        self.timeout, self.report = timeout, report  # report(seconds) -> True if stuck inside a task
        self.withdraw = withdraw  # () -> None: delete the report
        self.last = time.monotonic()
        self.armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rrfp-watchdog", daemon=True)

    def start(self) -> None:
        self.last = time.monotonic()
        self._thread.start()

    def arm(self) -> None:
        self.last = time.monotonic()
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def progress(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        exit_at = None
        while not self._stop.wait(min(0.5, self.timeout / 4)):
            exit_at = self.check(time.monotonic(), exit_at)

    def check(self, now: float, exit_at: float | None) -> float | None:
        """One look at the clock; returns when to exit (None: no stall pending)."""
        silent = now - self.last
        if not self.armed or silent <= self.timeout:
            if exit_at is not None:  # progress resumed after a report
                self.withdraw()
            return None
        if exit_at is None:
            in_task = self.report(silent)
            return now + (1.0 if in_task else max(2.0, self.timeout / 2))
        if now >= exit_at:
            os._exit(STALL_EXIT_CODE)
        return exit_at


class StatusBoard:
    """Where a rank is (job, iteration, task, running or not), in a small memory-mapped file.

    A rank killed outright (SIGKILL, the OOM killer) writes no report, but the
    pages of a shared file mapping outlive the process, so the launcher can
    still say "killed during 2B5, iteration 3". Updating it is a store into
    memory, no system call: the first byte is the state (``R`` running,
    ``I`` between tasks, ``F`` finished, ``S`` before the first iteration),
    then ``pid<TAB>job<TAB>iteration<TAB>task``.
    """

    SIZE = 256
    STATES = {ord("S"): "starting", ord("R"): "running", ord("I"): "idle", ord("F"): "finished"}

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, self.SIZE)
            self.map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)
        self.pid = os.getpid()
        self.prefix = f"{self.pid}\t\t\t".encode()
        self._write(b"S", b"")

    def iteration(self, job: str, iteration: int) -> None:
        self.prefix = f"{self.pid}\t{job}\t{iteration}\t".encode()
        self._write(b"I", b"")

    def running(self, task: str) -> None:
        self._write(b"R", task.encode())

    def idle(self) -> None:
        self.map[0] = ord("I")  # the last task stays: "after 2B5"

    def finished(self) -> None:
        self.map[0] = ord("F")

    def _write(self, state: bytes, task: bytes) -> None:
        data = (state + self.prefix + task)[: self.SIZE - 1] + b"\0"
        self.map[: len(data)] = data

    @classmethod
    def read(cls, path: Path) -> dict[str, Any] | None:
        """``{"state", "pid", "job", "iteration", "task"}`` as last written (None if there is no such file)."""
        try:
            raw = Path(path).read_bytes()
        except OSError:
            return None
        fields = raw[1:].split(b"\0", 1)[0].decode(errors="replace").split("\t")
        if not raw or raw[0] not in cls.STATES or len(fields) != 4 or not fields[0].isdigit():
            return None
        pid, job, iteration, task = fields
        return {"state": cls.STATES[raw[0]], "pid": int(pid), "job": job or None,
                "iteration": int(iteration) if iteration.isdigit() else None, "task": task or None}


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
        pending = getattr(arbiter, "pending", None)  # a TP follower: the leader's decisions it has yet to run
        if pending is not None:
            report["following"] = {"decisions_received": arbiter.followed,
                                   "next": [str(arbiter.graph.tasks[tid]) for _, tid, _, _ in list(pending)[:4]]}
    _failure_path(ctx, "stall").write_text(json.dumps(report, indent=1))
    return "task" in ctx.current


def _report_error(ctx: RankContext, err: BaseException) -> None:
    from runtime.comm.transport import TransportError

    from hints.errors import Interrupted

    kind = ("interrupt" if isinstance(err, Interrupted) else "transport" if isinstance(err, TransportError)
            else "error")
    report = {"rank": ctx.rank, "kind": kind,
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
