"""One rank's process: set up the process group and links, run the jobs, report.

:func:`worker_main` is the entry point every rank runs, whether started by
:mod:`runtime.run.launch` on one machine or by ``torchrun``. It owns everything a
rank has (process group, transport, stage modules, optimizer, watchdog) in one
:class:`RankContext` passed explicitly; there is no module-level state.

This module holds the rank's bootstrap (device and backend, process group,
clock offset, links, transport) and the job loop (:func:`_run_job`: set-up,
one training iteration at a time, results). The rest of a rank's jobs live
beside it in :mod:`runtime.run`:

* :mod:`runtime.run.health`: where the rank is (``status/rank<r>``), the
  watchdog, the failure reports (``failures/rank<r>-error.json``,
  ``-stall.json``) and non-finite losses. The launcher turns these files into
  one message naming the root cause (:mod:`runtime.run.diagnose`).
* :mod:`runtime.run.metrics`: the job's inputs and per-iteration metrics on disk.
* :mod:`runtime.run.noise`: injected jitter, stragglers, latencies and ``--delay``.
* :mod:`runtime.run.collect`: the results a job hands back (what tests compare).
* :mod:`runtime.run.progress`: rank 0's progress bar.

The first SIGINT or SIGTERM raises :class:`hints.errors.Interrupted` in the
main thread (later ones are ignored): the rank writes an ``interrupt`` report,
closes its trace recorder (every completed iteration is on disk) and stops.

Outputs are written as the job goes, so a failure keeps what finished:
``config.json`` (and an emulated job's ``durations.parquet``) before the first
iteration, one line of ``metrics.jsonl`` per iteration as it ends (rank 0),
and ``metrics.parquet`` from those lines at the end, or by the launcher
(:func:`runtime.run.metrics.salvage_metrics`) after a failure or an interrupt.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import threading
import time
import warnings
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from hints.outputs import is_disk_error, write_error
from runtime.run.health import StatusBoard, Watchdog, report_error, report_stall, withdraw_stall


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
    _name_process(rank)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, interrupted_once)
    threads = options.threads or max(1, (os.cpu_count() or 1) // max(1, world))
    torch.set_num_threads(threads)
    ctx = RankContext(rank, world, local_rank, torch.device("cpu"), out_root)
    watchdog = Watchdog(options.timeout, lambda seconds: report_stall(ctx, seconds), lambda: withdraw_stall(ctx))
    try:  # from here on a failure is reported, wherever it happens (a status file that cannot be made included)
        _redirect_output(rank, out_root)
        ctx.status = StatusBoard(out_root / "status" / f"rank{rank}")
        ctx.device, backend = _device_and_backend(jobs[0].config, local_rank, world)
        _while_signals_are_handled(lambda: _bootstrap(ctx, jobs, options, backend))
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
        report_failure(ctx, err, watchdog)
        raise
    finally:
        if dist.is_initialized() and not _bootstrap_running():  # not under a thread still using the group
            dist.destroy_process_group()


def _bootstrap(ctx: RankContext, jobs: list[Job], options: WorkerOptions, backend: str) -> None:
    """Everything a rank sets up with its peers before its first job: process group, clock offset, links,
    transport, TP/DP groups, and a barrier that every rank has done so."""
    import torch
    import torch.distributed as dist

    from runtime.comm.clock import clock_domain, measure_clock_offset
    from runtime.comm.grid import ProcessGrid, make_groups
    from runtime.comm.transport import Transport

    rank, world, config = ctx.rank, ctx.world, jobs[0].config
    if ctx.device.type == "cuda":  # the current device is per thread ([Note: bootstrap waits where signals land])
        torch.cuda.set_device(ctx.device)
    group_timeout = timedelta(seconds=max(60.0, 2 * options.timeout))
    dist.init_process_group(backend, timeout=group_timeout, **_attempt_store(rank, world, group_timeout),
                            **({"device_id": ctx.device} if backend == "nccl" else {}))
    if backend == "nccl":  # clock ping-pong and per-iteration timings are CPU tensors
        ctx.control_group = dist.new_group(backend="gloo")
    measured = measure_clock_offset(rank, world, group=ctx.control_group)
    ctx.clock_offset_ns, ctx.clock_error_ns = clock_domain(measured, ctx.control_group)
    ctx.grid = ProcessGrid.of(config, rank)
    links = ctx.grid.links([pair for job in jobs for pair in _job_links(job.config)])
    _log_links(ctx, backend, links)
    ctx.transport = Transport(rank, links, ctx.device, options.timeout, latency=None)
    ctx.groups = make_groups(ctx.grid, group_timeout)
    ctx.transport.start(timeout=options.timeout)
    dist.barrier()


BOOTSTRAP_THREAD = "rrfp-bootstrap"


def _bootstrap_running() -> bool:
    """Whether a bootstrap an interrupt left behind is still running ([Note: bootstrap waits where signals land])."""
    return any(thread.name == BOOTSTRAP_THREAD and thread.is_alive() for thread in threading.enumerate())


def _while_signals_are_handled(call):
    """``call()``, run in a thread of its own while this one waits for it, handling signals as they come.

    [Note: bootstrap waits where signals land]
        A rank that fails before the process group exists (its status file, its device, a bad address) left
        the others waiting inside ``init_process_group`` for it: C++ waiting on the store, for up to the group
        timeout (60 s or more), with the GIL released and no return to Python. A signal's Python handler runs
        only when the main thread returns to Python, so the elastic agent's SIGTERM, sent as soon as it saw
        the failure, was not handled: torch's process context then waits 30 s before its SIGKILL, and the run
        took about 35 s to end, the stopped ranks reported as "died without a report". So the whole bootstrap
        (:func:`_bootstrap`: every step that waits for peers) runs in a daemon thread while the main thread
        waits on it in short joins, where its handler runs at once: the SIGTERM is an
        :class:`hints.errors.Interrupted` (an ``interrupt`` report, which the diagnosis leaves out), the rank
        exits within a moment of the agent's signal, and the run ends about a second after the first failure,
        naming it. torchrun's agent sends the same SIGTERM. The thread, still waiting, ends with the process;
        the process group it may have made meanwhile is not destroyed under it. CUDA's current device is per
        thread, so the bootstrap thread sets it again.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # raised again in the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=run, name=BOOTSTRAP_THREAD, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)  # a signal's handler runs between (and during) these waits
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def report_failure(ctx: RankContext, err: BaseException, watchdog: Watchdog) -> None:
    """Write this rank's report of ``err``, which ended it, whole: an interrupt that comes meanwhile waits for it.

    [Note: a failed rank's report is written whole]
        A rank's failure ends its neighbours' transports, and the elastic agent, which sees the first
        rank exit within 0.1 s, sends every other rank SIGTERM at about the moment their transport errors
        arrive. Its handler (:func:`interrupted_once`) raised ``Interrupted`` inside the report of the
        transport error, which was then never written: the rank exited 143 with neither report, and the
        diagnosis named it, "died without a report", as the root cause in place of the rank that failed
        first (a CI run of tests/multiproc/test_faults.py). So SIGINT and SIGTERM are held while the report
        is written (:func:`_interrupts_held`) and delivered to the rank's handlers once it is on disk: the
        rank then stops at once, as before, but with its report. Ignoring them instead would leave a rank
        that then hangs (in ``destroy_process_group`` after a peer died) to the agent's SIGKILL, 5 s later
        under ``rrfp run`` and 30 s under ``torchrun``."""
    with _interrupts_held():
        watchdog.stop()
        report_error(ctx, err)


@contextmanager
def _interrupts_held():
    """SIGINT and SIGTERM wait until the block ends, then reach the handlers that were in place (the first one
    that came; a rank's handler ignores any after it). Only in the main thread, where handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in saved:
        signal.signal(signum, lambda got, frame: came.append(got))
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if came:
            signal.raise_signal(came[0])


def interrupted_once(signum: int, frame) -> None:
    """A rank's SIGINT / SIGTERM handler (and, through :class:`runtime.run.launch._FirstSignal`, the launcher's):
    the first raises :class:`hints.errors.Interrupted`; later ones are
    ignored. A Ctrl-C reaches a rank twice (the terminal's SIGINT, then the agent's SIGTERM), and a second
    signal must not cut short the report and the trace close the first one started ([Note: one interrupt,
    one shutdown] in :mod:`runtime.run.launch`)."""
    from hints.errors import Interrupted

    for other in (signal.SIGINT, signal.SIGTERM):  # not SIG_IGN: one already caught would print a race warning
        signal.signal(other, ignore_signal)
    raise Interrupted(signum)


def ignore_signal(signum: int, frame) -> None:
    """A signal handler that does nothing: a later interrupt while the first one's shutdown runs ([Note: one
    interrupt, one shutdown] in :mod:`runtime.run.launch`)."""


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
        raise RuntimeError("`device` cuda asked for, but CUDA is not available")
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = config.backend
    if backend == "auto":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        backend = "nccl" if use_cuda and torch.cuda.device_count() >= local_world else "gloo"
    return device, backend


def _link_wire(backend: str) -> str:
    """What a pipeline link runs over ([Note: dispatcher reads the sockets] in runtime.comm.sockets)."""
    if backend != "gloo":
        return backend
    from runtime.comm.frames import BODY_BYTES

    return f"a TCP connection each (frames, payloads up to {BODY_BYTES >> 20} MiB) and gloo (larger payloads)"


def _log_links(ctx: RankContext, backend: str, links) -> None:
    """One line per rank in ``logs/run.log``: its device and what each of its links runs over."""
    peers = sorted({peer for pair in links for peer in pair if ctx.rank in pair and peer != ctx.rank})
    control = "gloo" if ctx.control_group is not None else backend
    where = f" ({ctx.grid.describe()})" if ctx.grid.world > ctx.grid.pp else ""
    line = (f"rank {ctx.rank}{where} (local {ctx.local_rank}): device {ctx.device}; links to "
            f"{', '.join(f'rank {p}' for p in peers) or 'no rank'} over {_link_wire(backend)}; control collectives over "
            f"{control}\n")
    append_line(ctx.out_root / "logs" / "run.log", line)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` to a log every rank appends to, in one ``write`` (lines of ranks do not interleave).

    [Note: logs on a full disk]
        ``logs/run.log`` is shared by the ranks, so it cannot be rewritten whole (:mod:`hints.outputs`): each
        rank appends its line. A refused append (a full disk, or part of the line written) is the
        :class:`hints.outputs.DiskError` naming the disk that any other output of the run gives: the rank
        stops there, as at the first refused write of its metrics or trace ([Note: a full disk under rrfp
        run] in :mod:`rrfp_cli.cmd_run`), rather than running on to fail at the next one, and it is no raw
        ``OSError``. A rank's own stdout and stderr (``logs/rank<r>.log``) are another matter: any module
        may print there, anywhere, so a line the disk refuses is dropped (:class:`_RankLog`), not raised
        out of whatever printed it.
    """
    data = line.encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as err:
        raise write_error(err, path) from None
    if written < len(data):  # room for part of the line only
        raise write_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path)


def _name_process(rank: int) -> None:
    """Name this process ``rrfp rank <r>``, so ``ps -e``, ``ps -o comm``, ``top`` and ``pgrep`` tell the ranks apart.

    Linux keeps a process's name (``/proc/<pid>/comm``, at most 15 bytes) apart from its command line, and lets the
    process set it (``prctl(PR_SET_NAME)``; writing ``comm`` does the same for the main thread from any thread).
    The command line (``ps -f``, ``ps aux``) stays what started the process: the fork server's line under ``rrfp
    run``, ``python -m rrfp_cli run ...`` under torchrun; rewriting it needs a C extension. Threads started after
    this (transport, watchdog) inherit the name. Elsewhere, or if ``/proc`` refuses: nothing changes.
    """
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(f"rrfp rank {rank}"[:15])
    except OSError:
        pass


def _redirect_output(rank: int, out_root: Path) -> None:
    """Ranks other than 0 write stdout/stderr (Python and C level) to ``logs/rank<r>.log``."""
    if rank == 0:
        return
    path = out_root / "logs" / f"rank{rank}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # unbuffered beneath: a refused write leaves nothing behind to be written again at the next line
        handle = _RankLog(open(path, "ab", buffering=0), encoding="utf-8", errors="backslashreplace",
                          write_through=True)
    except OSError as err:
        raise write_error(err, path) from None
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(handle.fileno(), 1)
    os.dup2(handle.fileno(), 2)
    sys.stdout = sys.stderr = handle


class _RankLog(io.TextIOWrapper):
    """A rank's ``logs/rank<r>.log`` as its stdout and stderr: what the disk refuses is dropped, not raised out of
    whatever printed it ([Note: logs on a full disk])."""

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except OSError as err:
            if not is_disk_error(err):
                raise
            return len(text)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as err:
            if not is_disk_error(err):
                raise


def _run_job(ctx: RankContext, job: Job, options: WorkerOptions, watchdog: Watchdog) -> dict[str, Any]:
    """Run one job on this rank: set it up, train its iterations, return its results (:mod:`runtime.run.collect`)."""
    from runtime.run.metrics import MetricsLog
    from runtime.run.progress import ProgressBar

    run = _JobRun(ctx, job, watchdog)
    bar = ProgressBar(job, job.config) if ctx.rank == 0 and options.show_progress else None
    rows, losses = [], []
    metrics = MetricsLog(run.out_dir, resume_at=run.start) if ctx.rank == 0 else None
    try:
        for iteration in range(run.start, job.config.iters):
            row = run.iteration(iteration)
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
        run.recorder.close()
    if metrics:
        metrics.close()
    return run.results.finish(run.recorder, losses, rows if ctx.rank == 0 else None)


class _JobRun:
    """One job on this rank: everything it is built from (``__init__``) and one training iteration
    (:meth:`iteration`). The launcher validated the job (hint, budget, completion) before any rank started."""

    def __init__(self, ctx: RankContext, job: Job, watchdog: Watchdog) -> None:
        from hints.deps import TaskGraph
        from runtime.comm.grid import SliceTransport
        from runtime.config import run_shape
        from runtime.exec.executor import StageExecutor
        from runtime.run.collect import JobResults
        from runtime.run.health import TrackingRecorder
        from runtime.run.metrics import write_job_inputs
        from runtime.run.noise import NoiseInjector
        from runtime.run.plan import HintPlan
        from runtime.sched.budget import MemoryBudget
        from runtime.sched.fixed_order import SafeAdmission
        from runtime.workloads.make import make_optimizer, make_workload

        self.ctx, self.job, self.config, self.watchdog = ctx, job, job.config, watchdog
        config, grid = job.config, ctx.grid
        pipe = self.pipe = grid.pipe_rank  # the pipeline's rank: hint orders, budgets, arbiters and the executor
        self.out_dir = Path(job.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        from runtime.workloads.user import ParallelGroups

        groups = ParallelGroups(tp=grid.tp, tp_rank=grid.tp_rank, tp_group=ctx.groups.tp, dp=grid.dp,
                                dp_rank=grid.dp_rank, dp_group=ctx.groups.dp)
        self.workload = workload = make_workload(config, run_shape(config), ctx.device, replica=grid.dp_rank,
                                                 groups=groups)
        workload.prepare(run_shape(config).stages_of_rank(pipe))
        if ctx.rank == 0:
            write_job_inputs(self.out_dir, config, workload)
        self.plan = HintPlan(config, workload)
        shape = self.plan.for_iteration(0).shape  # the hint decides whether backwards are split
        workload.split_stages = frozenset(shape.split_stages)
        self.graph = TaskGraph.build(shape)
        self.rule = config.rule()
        budget = MemoryBudget.parse(config.memory_budget) if self.rule.uses_budget else None  # auto: ready's
        budgets = budget.per_rank(shape) if budget is not None else None
        self.auto = None  # [Note: the auto policy] in runtime.sched.auto
        if config.policy == "auto":
            from runtime.sched.auto import AutoPolicy

            self.auto = AutoPolicy(self.rule, budget)
        self.budget = budgets[pipe] if budgets else None
        self.safe_admission = SafeAdmission(self.graph, budgets)  # [Note: safe-state admission]
        self.modules = modules = _stage_modules(ctx, workload, shape.stages_of_rank(pipe))
        self.optimizer = make_optimizer([p for m in modules.values() for p in m.parameters()], config)
        noise = NoiseInjector(config, ctx.rank, workload)
        _seed_rank(config, pipe)  # the pipeline rank: a TP group draws alike (pipe == rank without --tp/--dp)
        self.checkpointer, self.start = _restore(ctx, job, workload, modules, self.optimizer, noise)
        self.results = JobResults(job.collect_grads, modules, self.budget, grid)
        self.recorder = _load_recorder(ctx, job, self.out_dir, self.budget) if job.recorder else self.results.recorder()
        ctx.transport.latency = noise.latency
        self.executor = StageExecutor(
            pipe, self.graph, workload, modules, SliceTransport(ctx.transport, grid), ctx.device,
            recorder=TrackingRecorder(self.recorder, ctx), progress=watchdog.progress,
            lookahead=self.rule.lookahead and grid.is_leader, blocking=config.p2p == "blocking",
        )
        ctx.executor = self.executor
        self.reducer = _gradient_reducer(ctx, modules, shape, self.executor)
        _install_injections(self.executor, config, noise)

    def iteration(self, iteration: int) -> dict[str, Any]:
        """Train one iteration: the executor's tasks, the optimizer step, the end-of-iteration barrier, a
        checkpoint when due. Returns its metrics row."""
        from runtime.exec.tp_follow import member_arbiter
        from runtime.run.health import step_allowed
        from runtime.run.metrics import gather_summaries, metrics_row
        from runtime.sched.rules import RULES, make_arbiter

        ctx, config, grid, pipe, executor, reducer = (self.ctx, self.config, self.ctx.grid, self.pipe, self.executor,
                                                      self.reducer)
        ctx.current = {"job": self.job.name, "iteration": iteration}
        ctx.status.iteration(self.job.name, iteration)
        self.watchdog.arm()  # per iteration: set-up (model, workload) may take long on a loaded machine
        hint = self.plan.for_iteration(iteration)
        rule, decision = self.rule, None
        if self.auto is not None:
            decision = self.auto.decide(iteration, hint)
            rule = RULES[decision.rule]
            decided = getattr(self.recorder, "rule_decided", None)  # the trace recorder writes it
            if decided is not None:
                decided(iteration, decision.label, decision.reason)
        arbiter = member_arbiter(
            grid, lambda: make_arbiter(rule, self.graph, pipe, hint.orders[pipe], self.budget, record=True,
                                       estimates=executor.forecast.estimates if executor.forecast else None,
                                       safe=self.safe_admission(hint)),
            self.graph, hint.orders[pipe], ctx.transport, iteration, ctx.clock_offset_ns)
        began = time.perf_counter()
        if reducer:
            reducer.begin_iteration()
        result = executor.run_iteration(iteration, arbiter)
        reduced = reducer.finish() if reducer else None
        if not grid.is_leader:  # the group's loss and units are counted once, by its leader
            result.loss, result.units = None, 0
        self.results.iteration_ran(iteration, result)
        step_began = time.monotonic_ns()
        stepped = step_allowed(ctx, config, result, iteration)
        if stepped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.results.stepped()
        self.watchdog.progress()
        if ctx.device.type == "cuda" and config.traces(iteration):
            import torch

            torch.cuda.synchronize()  # the step's kernels in its span, not in the barrier's
        barrier_began = time.monotonic_ns()
        # also the barrier between iterations; times on rank 0's clock, so makespans compare across ranks
        gathered = gather_summaries(ctx.world, result, ctx.control_group, ctx.clock_offset_ns, reduced)
        self.recorder.optimizer_step(iteration, step_began, barrier_began, time.monotonic_ns())
        self.watchdog.disarm()
        wall = time.perf_counter() - began
        row = metrics_row(iteration, gathered, wall, self.workload.unit, with_reduce=reducer is not None)
        if self.auto is not None:
            from runtime.run.auto import gather_realized

            # the first iteration a process runs pays one-off start-up costs; a hint whose fixed order exceeds
            # the budget never runs fixed, so its iterations are neither gathered nor replayed (every rank agrees)
            if iteration > self.start and self.auto.fixed_fits(hint):
                table, makespan = gather_realized(ctx, result, self.graph)
                self.auto.observe(hint, table, rule.name, makespan)
            row["policy"] = decision.to_json()
        if config.skip_nonfinite:
            row["skipped_step"] = not stepped
        if self.checkpointer is not None:  # a collective, after the barrier above; its row follows it
            row["checkpoint_seconds"] = self.checkpointer.save_if_due(iteration + 1, config)
        return row


def _load_recorder(ctx: RankContext, job: Job, out_dir: Path, budget: int | None):
    """The recorder a job names (``"module:Class"``, e.g. the trace writer), built for this rank."""
    from runtime.exec.recording import RecorderSetup, load_recorder_class

    setup = RecorderSetup(ctx.rank, ctx.world, str(out_dir), job.name, job.config, ctx.device, ctx.clock_offset_ns,
                          ctx.clock_error_ns, budget, ctx.grid)
    return load_recorder_class(job.recorder)(setup)


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


def _restore(ctx: RankContext, job: Job, workload, modules: dict, optimizer, noise):
    """This job's checkpointer (None when it neither writes nor resumes) and the iteration it starts at.

    Resuming loads model, optimizer and RNG states (a collective), moves the data to the checkpoint's
    position, and sets this rank's trace of the earlier attempt aside (``trace-before-step-<N>/``) so
    the new trace covers the resumed iterations only.
    """
    config = job.config
    if not config.checkpoint_every and not job.resume:
        return None, 0
    from runtime.run.checkpoint import RankCheckpointer, TPSharding
    from runtime.workloads.tp_layers import stage_sharded_layouts

    sharding = (TPSharding(stage_sharded_layouts(modules, "stage"), ctx.groups.tp,
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
    """This rank's stage modules: whole, or with ``--tp`` its shard of each ([Note: TP coordination]); a user's
    factory shards its own ([Note: tensor parallelism for a model you bring])."""
    modules = {stage: workload.build_stage(stage) for stage in stages}
    if ctx.grid.tp > 1 and not getattr(workload, "shards_itself", False):
        from runtime.workloads.tp_layers import TPShard, shard_stage

        shard = TPShard(ctx.grid.tp_rank, ctx.grid.tp, ctx.groups.tp)
        modules = {stage: shard_stage(module, shard) for stage, module in modules.items()}
    return {stage: module.to(ctx.device) for stage, module in modules.items()}


def _gradient_reducer(ctx: RankContext, modules: dict, shape, executor):
    """With ``--dp``: the reducer that averages this rank's gradients over the replicas (None without)."""
    if ctx.grid.dp == 1:
        return None
    from runtime.run.dp import GradientReducer

    reducer = GradientReducer(modules, ctx.groups.dp, ctx.grid.dp, shape.microbatches)
    reducer.install(executor.handlers)
    return reducer
