"""``rrfp run``: train a pipeline-parallel model across processes with the readiness-driven runtime.

[Note: a full disk under rrfp run]
    A disk that refuses the run's outputs ends it with one line naming the
    disk (:func:`hints.outputs.disk_message`: the file, the file system and
    what is free on it), then what was kept, and exit 1. The ranks stop at
    the first refused write (``metrics.jsonl``, a rank's trace: [Note: a
    trace the disk refuses] in :mod:`profiler.trace.recorder`; their status
    files are allocated when created, so a full disk is ENOSPC there, not a
    SIGBUS later), but their reports are writes too and may be lost, so the
    launcher decides: a refused ``metrics.parquet`` or ``trace.pftrace``
    while keeping what finished, or else a small probe write into the run
    directory (:func:`_disk_refusal`), names the disk; what the ranks
    reported follows. Nothing finished is lost: the complete lines of
    ``metrics.jsonl`` and the whole iterations of each rank trace stay when
    there is no room to convert or merge them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from hints.errors import Failure, Interrupted, UserError
from hints.outputs import DiskError, check_room
from rrfp_cli.options import (
    SPLIT_OVERHEAD_HELP,
    UNKNOWN_HELP,
    VARIABILITY_HELP,
    WORKLOAD_HELP,
    LookaheadChoice,
    P2POpt,
    lookahead_flag,
    p2p_value,
)
from rrfp_cli.output import Column, Output, print_table
from runtime.config import RunConfig, build_config, load_toml

RUN = "Run"
MODEL = "Model"
VAR = "Variability (emulated: sampled durations; gpt/multimodal: injected delays)"
TEST = "Failure testing"
CKPT = "Checkpoints"
D = RunConfig()  # defaults, for help texts
TRACE_RECORDER = "profiler.trace.recorder:TraceRecorder"


def _opt(*names: str, help: str, panel: str = RUN, **kw):
    # Every default is None (a flag wins over --config, which wins over RunConfig's default): the help says it.
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False, **kw)


def run(
    workload: Annotated[Optional[str], _opt("--workload", help=f"gpt, multimodal, emulated, or your model's package.module:factory [default: {D.workload}]")] = None,
    ranks: Annotated[Optional[int], _opt("--ranks", "-p", "--stages", help=f"Pipeline ranks; the model has ranks x chunks stages (--stages: its older name) [default: {D.ranks}]")] = None,
    chunks: Annotated[Optional[int], _opt("--chunks", "-v", help="Model chunks per rank [default: 1; 2 under V placement]")] = None,
    microbatches: Annotated[Optional[int], _opt("--microbatches", "-m", help=f"Per iteration [default: {D.microbatches}]")] = None,
    placement: Annotated[Optional[str], _opt("--placement", help="looping (stage k on rank k % p) or v (rank r holds stages r and 2p-1-r) [default: the hint's own]")] = None,
    tp: Annotated[Optional[int], _opt("--tp", help=f"Tensor-parallel ranks per stage (leader decides, followers follow) [default: {D.tp}]")] = None,
    dp: Annotated[Optional[int], _opt("--dp", help=f"Data-parallel replicas of the whole pipeline [default: {D.dp}]")] = None,
    hint: Annotated[Optional[str], _opt("--hint", help="Built-in, hint file or torch:SCHEDULE [default: 1f1b / interleaved-1f1b / zbv under V]")] = None,
    policy: Annotated[Optional[str], _opt("--policy", help=f"ready, fixed or auto (simulate --help says what each does) [default: {D.policy}]")] = None,
    lookahead: Annotated[Optional[LookaheadChoice], _opt("--lookahead", help="ready only: on = no task that would delay the hint's next task already on its way (a forward or a backward); off = greedy [default: on]")] = None,
    p2p: P2POpt = None,
    memory_budget: Annotated[Optional[str], _opt("--memory-budget", help="1f1b, 2x, or slots per rank [default: 1f1b]")] = None,
    iters: Annotated[Optional[int], _opt("--iters", help=f"Training iterations [default: {D.iters}]")] = None,
    seed: Annotated[Optional[int], _opt("--seed", help="Seed for model init, data and variability [default: 0]")] = None,
    lr: Annotated[Optional[float], _opt("--lr", help=f"AdamW learning rate [default: {D.lr}]", panel=MODEL)] = None,
    hidden: Annotated[Optional[int], _opt("--hidden", help=f"Model width [default: {D.hidden}]", panel=MODEL)] = None,
    heads: Annotated[Optional[int], _opt("--heads", help=f"Attention heads [default: {D.heads}]", panel=MODEL)] = None,
    layers_per_stage: Annotated[Optional[int], _opt("--layers-per-stage", help="Blocks per model stage [default: 1]", panel=MODEL)] = None,
    vocab: Annotated[Optional[int], _opt("--vocab", help=f"Vocabulary size [default: {D.vocab}]", panel=MODEL)] = None,
    samples: Annotated[Optional[int], _opt("--samples", help="Samples per microbatch [default: an emulated preset's own, else 2]", panel=MODEL)] = None,
    seq_len: Annotated[Optional[int], _opt("--seq-len", help="gpt: fixed sequence length [default: variable]", panel=MODEL)] = None,
    emulate: Annotated[Optional[str], _opt("--emulate", help=f"Duration model of --workload emulated: {WORKLOAD_HELP} [default: {D.emulate}]", panel=VAR)] = None,
    forward_time: Annotated[Optional[float], _opt("--forward-time", help=f"{VARIABILITY_HELP['forward_time']} Emulated only [default: {D.forward_time}]", panel=VAR)] = None,
    backward_ratio: Annotated[Optional[float], _opt("--backward-ratio", help=f"{VARIABILITY_HELP['backward_ratio']} Emulated only [default: {D.backward_ratio:g}]", panel=VAR)] = None,
    split_overhead: Annotated[Optional[float], _opt("--split-overhead", help=f"Emulated workloads only. {SPLIT_OVERHEAD_HELP}", panel=VAR)] = None,
    jitter: Annotated[Optional[float], _opt("--jitter", help=f"{VARIABILITY_HELP['jitter']} [default: {D.jitter:g}]", panel=VAR)] = None,
    straggler_prob: Annotated[Optional[float], _opt("--straggler-prob", help=f"{VARIABILITY_HELP['straggler_prob']} [default: {D.straggler_prob:g}]", panel=VAR)] = None,
    straggler_slowdown: Annotated[Optional[float], _opt("--straggler-slowdown", help=f"{VARIABILITY_HELP['straggler_slowdown']} [default: {D.straggler_slowdown:g}]", panel=VAR)] = None,
    comm_latency: Annotated[Optional[float], _opt("--comm-latency", help=f"{VARIABILITY_HELP['comm_latency']} [default: {D.comm_latency:g}]", panel=VAR)] = None,
    comm_jitter: Annotated[Optional[float], _opt("--comm-jitter", help=f"{VARIABILITY_HELP['comm_jitter']} [default: {D.comm_jitter:g}]", panel=VAR)] = None,
    unknown: Annotated[Optional[str], _opt("--unknown", help=f"Emulated only. {UNKNOWN_HELP} [default: none]", panel=VAR)] = None,
    delay: Annotated[Optional[list[str]], _opt("--delay", help="TASK=SECONDS extra time for one task, e.g. 1B0=0.3 (repeatable)", panel=VAR)] = None,
    fail_at: Annotated[Optional[str], _opt("--fail-at", help="Raise inside this task: 1F2 (first iteration) or 1F2@3 (iteration 3)", panel=TEST)] = None,
    hang_at: Annotated[Optional[str], _opt("--hang-at", help="Never return from this task (same form as --fail-at)", panel=TEST)] = None,
    timeout: Annotated[Optional[float], _opt("--timeout", help="Seconds without progress before a rank reports a stall and the run stops [default: 60]")] = None,
    nproc: Annotated[Optional[int], _opt("--nproc", help="Processes [default: ranks x tp x dp]")] = None,
    device: Annotated[Optional[str], _opt("--device", help="auto, cpu or cuda [default: auto]")] = None,
    backend: Annotated[Optional[str], _opt("--backend", help="auto, gloo or nccl [default: auto: nccl with one GPU per rank]")] = None,
    out: Annotated[Optional[str], _opt("--out", help="Run directory, new or empty [default: runs/<timestamp>-<workload>, with -2, -3... if taken]")] = None,
    trace: Annotated[Optional[bool], _opt("--trace/--no-trace", help="Write a Perfetto trace, trace.pftrace [default: on]")] = None,
    trace_iters: Annotated[Optional[str], _opt("--trace-iters", help="A:B traces iterations A..B-1 only (long jobs)")] = None,
    checkpoint_every: Annotated[Optional[int], _opt("--checkpoint-every", help="Write a checkpoint (model, optimizer, RNG states, data position) after every K iterations", panel=CKPT)] = None,
    skip_nonfinite: Annotated[Optional[bool], _opt("--skip-nonfinite/--stop-on-nonfinite", help="A NaN or infinite loss skips that optimizer step instead of stopping the run [default: stop]", panel=CKPT)] = None,
    resume: Annotated[Optional[Path], _opt("--resume", help="Continue RUN_DIR from its latest checkpoint, in RUN_DIR (its config.json, then --config, then flags)", panel=CKPT)] = None,
    config_file: Annotated[Optional[Path], _opt("--config", help="TOML file whose keys are these flags' names (flags win)")] = None,
    compare: Annotated[bool, _opt("--compare", help="Also run fixed-order 1F1B and the same hint in fixed order first, and compare (what the hint gives vs what readiness adds); for a hint that orders by known cost (bfw, cp), also 1F1B sorted by those costs in fixed order")] = False,
    json_mode: Annotated[bool, _opt("--json", help="Print one JSON object instead of tables")] = False,
) -> None:
    """Train a model split into pipeline stages, one process per rank (or join a torchrun job)."""
    flags = {name: value for name, value in locals().items()
             if value is not None and name not in ("config_file", "compare", "json_mode", "delay", "resume")}
    if lookahead is not None:
        flags["lookahead"] = lookahead_flag(lookahead)
    if p2p is not None:
        flags["p2p"] = p2p_value(p2p)
    if delay:
        flags["delay"] = _parse_delays(delay)
    file_values = load_toml(config_file) if config_file else {}
    if resume is not None:
        file_values = {**_resumed_values(resume, flags, compare), **file_values}
    config = build_config(file_values, flags, str(config_file or "flags"))
    out_dir = Output(json_mode)
    _run(config, compare, out_dir, resume)


def _resumed_values(run_dir: Path, flags: dict[str, Any], compare: bool) -> dict[str, Any]:
    """``--resume RUN_DIR``: the configuration RUN_DIR ran with; the run continues there."""
    from runtime.run.checkpoint import latest

    if compare:
        raise UserError("a --compare run cannot be resumed; resume one of its jobs' directories", "--resume")
    if "out" in flags:
        raise UserError("a resumed run continues in its own directory; drop --out", "--resume")
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a directory", "--resume")
    if latest(run_dir) is None:
        raise UserError(f"{run_dir} holds no checkpoint (runs write them with --checkpoint-every K)", "--resume")
    try:
        values = json.loads((run_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"cannot read {run_dir / 'config.json'}: {err}", "--resume") from None
    return {**values, "out": str(run_dir)}


def _parse_delays(items: list[str]) -> dict[str, float]:
    delays = {}
    for item in items:
        task, sep, seconds = item.partition("=")
        try:
            delays[task.strip()] = float(seconds)
        except ValueError:
            sep = ""
        if not sep:
            raise UserError(f"{item!r} is not TASK=SECONDS (e.g. 1B0=0.3)", "--delay")
    return delays


def _run(config: RunConfig, compare: bool, out: Output, resume: Path | None = None) -> None:
    from runtime.run.launch import RunFailed, launch, preflight, start_fork_server, under_torchrun
    from runtime.run.worker import Job, WorkerOptions

    if not under_torchrun():
        start_fork_server()  # its imports (torch, ...) overlap this process's own checks and imports

    # [Note: equal memory] in runtime.sched.evaluate: the speedup over fixed 1F1B mixes what the hint's
    # structure gives with what readiness adds; the same hint in fixed order separates the two. The
    # baseline keeps the job's placement (under V it is ZB-V, hints.orders.baseline_hint_name).
    configs = [config]
    best_fixed: list[RunConfig] = []  # [Note: the best fixed order at equal memory] in runtime.sched.baselines
    if compare:
        from runtime.config import run_shape

        # Both fixed jobs use buffered links: a --p2p blocking job is then compared with async fixed order.
        baseline = config.with_overrides(policy="fixed", hint=None, lookahead=None, p2p="async",
                                         placement=run_shape(config).placement)
        configs = [baseline, config.with_overrides(policy="fixed", lookahead=None, p2p="async"), config]
        if _orders_by_cost(config):
            best_fixed = _best_fixed_configs(config)
            configs[1:1] = best_fixed
    named = {_job_name(c): c for c in configs}  # a hint that is 1f1b in fixed order runs once
    preflight(list(named.values()))  # bad input fails before anything is written
    checkpoint = _checkpoint_to_resume(config, resume)
    root = Path(resume) if resume is not None else _claim_run_dir(config)
    recorder = TRACE_RECORDER if config.trace else None
    jobs = [Job(name, c, str(root / name if compare else root), recorder=recorder, resume=checkpoint)
            for name, c in named.items()]
    options = WorkerOptions(out_root=str(root), show_progress=not out.json_mode, timeout=config.timeout)
    if options.show_progress:
        _say_where(root)
    began = time.perf_counter()
    try:
        results = launch(jobs, options, config.nproc or config.world_size, checked=True)
    except RunFailed as err:  # app.main: the cause, then what was kept; exit 1
        bad_input = _bad_input_found_by_ranks(root, began) if err.reports else None
        if bad_input is not None:
            raise bad_input from None
        kept = _keep_what_finished(jobs, config, err.reports)
        refused = kept.refused or _disk_refusal(root)
        if refused is not None:  # [Note: a full disk under rrfp run]
            raise Failure(f"run failed: {refused}", kept.text) from None  # the ranks saw only its effects
        raise Failure(f"run failed: {err}", kept.text) from None
    except Interrupted:
        sys.stderr.write(_keep_what_finished(jobs, config).text)
        raise
    if under_torchrun() and 0 not in results:
        return  # only rank 0 reports
    try:
        _merge_traces(jobs, config)
    except DiskError as err:  # [Note: a full disk under rrfp run]: every iteration ran, the merge had no room
        raise Failure(f"run finished, but {err}", "".join(
            f"kept every iteration of {job.name} in {job.out_dir} (metrics.parquet, trace/rank<r>.pftrace: "
            f"`rrfp trace merge {job.out_dir}` once there is room)\n" for job in jobs)) from None
    summaries = [_summarise(job, results[0][job.name]["metrics"]) for job in jobs]
    data: dict[str, Any] = {"out": str(root), "seconds": time.perf_counter() - began, "jobs": summaries}
    if compare:
        last = summaries[-1]["median_wall_seconds"]
        data["speedup"] = summaries[0]["median_wall_seconds"] / last
        data["speedup_vs_fixed_hint"] = summaries[-2]["median_wall_seconds"] / last if len(jobs) > 2 else None
        # [Note: equal memory]: readiness's own share is only clean when it held no more than the fixed order.
        data["vs_fixed_hint_at_equal_memory"] = (summaries[-1]["peak_in_flight"] <= summaries[-2]["peak_in_flight"]
                                                 if len(jobs) > 2 else None)
        names = {_job_name(c) for c in best_fixed}
        candidates = [s for s in summaries[1:-1] if s["job"] in names]
        if candidates:  # the faster of the fixed orders a user could run without readiness
            best = min(candidates, key=lambda s: s["median_wall_seconds"])
            data["best_fixed_job"] = best["job"]
            data["speedup_vs_best_fixed"] = best["median_wall_seconds"] / last
    out.result(data, lambda console: _render(console, data))


def _say_where(root: Path) -> None:
    """Without a terminal for the progress bar (CI logs, batch jobs), say the run directory before the ranks
    start (their set-up takes seconds); rank 0 then prints a line per iteration (:mod:`runtime.run.progress`).
    Under ``torchrun`` only rank 0 says it."""
    from runtime.run.launch import under_torchrun

    if Console(stderr=True).is_terminal or (under_torchrun() and os.environ.get("RANK") != "0"):
        return
    sys.stderr.write(f"rrfp run -> {root}\n")
    sys.stderr.flush()


def _best_fixed_configs(config: RunConfig) -> list[RunConfig]:
    """The fixed orders --compare runs beside a hint that orders by known cost: 1F1B sorted lightest first by those
    costs, and the order planned on them within the job's memory budget ([Note: planned orders] in
    :mod:`runtime.sched.baselines`), which also takes a split backward's gain without readiness."""
    from runtime.sched.baselines import PLANNED

    return [config.with_overrides(policy="fixed", hint=hint, lookahead=None, p2p="async")
            for hint in ("1f1b-light", PLANNED)]


def _orders_by_cost(config: RunConfig) -> bool:
    """Whether the hint is a built-in that orders microbatches by known cost (``bfw``, ``cp``), so --compare also
    runs the fixed orders a user could run on the same costs without readiness (:func:`_best_fixed_configs`)."""
    from hints.orders import BUILTIN_HINTS
    from runtime.config import run_shape

    builtin = BUILTIN_HINTS.get(config.hint or "")
    takes = builtin is not None and (builtin.takes_costs or builtin.takes_priorities) and config.hint != "1f1b-light"
    return takes and run_shape(config).placement == "looping"


def _checkpoint_to_resume(config: RunConfig, resume: Path | None) -> str | None:
    """The checkpoint the job starts from: ``--resume``'s, or under ``torchrun --max-restarts`` a restarted
    job's own latest one (``TORCHELASTIC_RESTART_COUNT`` > 0); checked against the job before any rank starts."""
    from runtime.run.checkpoint import check_resumable, latest
    from runtime.run.launch import under_torchrun

    if resume is None and under_torchrun() and config.checkpoint_every \
            and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        own = Path(config.out or _torchrun_out(config))
        resume = own if latest(own) is not None else None
    return None if resume is None else str(check_resumable(config, resume))


def _claim_run_dir(config: RunConfig) -> Path:
    """Create the run directory before any rank starts; never reuse one that holds files.

    ``--out`` may name a new or an empty directory. The default,
    ``runs/<timestamp>-<workload>``, gets ``-2``, ``-3``... when taken
    (claimed with an atomic ``mkdir``, so two runs started in the same
    second get two directories). Under ``torchrun`` every rank must agree
    without talking, so the name comes from torchrun's run id (else its
    port) and the ranks share it.
    """
    from runtime.run.launch import under_torchrun

    if under_torchrun():
        return Path(config.out or _torchrun_out(config))
    if config.out is not None:
        root = Path(config.out)
        _make_dir(root, "--out")
        if any(root.iterdir()):
            raise UserError(f"{root} already holds files; give a new or empty directory", "--out")
        return root
    base = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{_workload_tag(config)}"
    _make_dir(base.parent, "--out")
    for n in range(1, 1000):
        root = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            root.mkdir()
            return root
        except FileExistsError:
            continue
        except OSError as err:
            raise UserError(f"cannot create {root}: {err.strerror}", "--out") from None
    raise UserError(f"{base}-2 .. -999 are all taken", "--out")


def _make_dir(path: Path, flag: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create {path}: {err.strerror or err}", flag) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cannot write into {path}", flag)


def _torchrun_out(config: RunConfig) -> str:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    tag = run_id if run_id != "none" else f"torchrun-{os.environ['MASTER_PORT']}"
    return f"runs/{tag}-{_workload_tag(config)}"


def _workload_tag(config: RunConfig) -> str:
    """The workload in a directory name: ``examples.llama_pipeline:build`` -> ``llama_pipeline-build``."""
    module, _, factory = config.workload.partition(":")
    return f"{module.rsplit('.', 1)[-1]}-{factory}" if factory else module


def _merge_traces(jobs, config: RunConfig) -> None:
    if config.trace:
        from profiler.trace.recorder import merge_run_traces

        for job in jobs:
            merge_run_traces(Path(job.out_dir))


@dataclass
class Kept:
    """What :func:`_keep_what_finished` kept: a line per job (``text``), and the first write the disk refused
    (:func:`hints.outputs.disk_message`), if one was."""

    text: str = ""
    refused: str | None = None


def _bad_input_found_by_ranks(root: Path, began: float) -> UserError | None:
    """The ``UserError`` a rank raised before its first task (see :func:`runtime.run.health.report_error`), when
    that is why the run failed; None otherwise."""
    from runtime.run.diagnose import failure_reports

    for report in failure_reports(root, time.time() - (time.perf_counter() - began)):
        found = report.get("user_error")
        if found and report.get("task") is None:
            return UserError(found["what"], found.get("where"))
    return None


def _keep_what_finished(jobs, config: RunConfig, reports: bool | None = None) -> Kept:
    """After a failure or an interrupt: completed iterations' metrics to Parquet, rank traces merged.

    Returns what was kept, a line per job, for the message. Under ``torchrun`` only the reporting rank does this. A disk
    with no room for ``metrics.parquet`` or ``trace.pftrace`` keeps ``metrics.jsonl`` and the rank traces as
    they are ([Note: a full disk under rrfp run]).
    """
    from runtime.run.launch import under_torchrun
    from runtime.run.metrics import logged_rows, salvage_metrics

    if reports is None:  # an interrupt: rank 0 reports ([Note: who reports under torchrun] for a failure)
        reports = not under_torchrun() or os.environ.get("RANK") == "0"
    if not reports:
        return Kept()
    lines, refused = [], None
    for job in jobs:
        out_dir = Path(job.out_dir)
        try:
            kept, files = salvage_metrics(out_dir), ["metrics.parquet"]
        except DiskError as err:
            refused = refused or str(err)
            kept, files = len(logged_rows(out_dir)), ["metrics.jsonl"]
        if not kept and not (out_dir / "metrics.parquet").exists():
            continue
        try:
            _merge_traces([job], config)
            files += ["trace.pftrace"] if (out_dir / "trace.pftrace").exists() else []
        except DiskError as err:
            refused = refused or str(err)
            files += ["trace/rank<r>.pftrace"]
        except (UserError, OSError) as err:
            lines.append(f"{job.name}: could not merge its rank traces: {err}")
        what = f"{kept} completed iteration{'s' if kept != 1 else ''}" if kept else "the whole job"
        lines.append(f"kept {what} of {job.name} in {out_dir} ({', '.join(files)})")
    return Kept("".join(line + "\n" for line in lines), refused)


def _disk_refusal(root: Path) -> str | None:
    """Whether the run directory's file system refuses writes now (full, over quota, read-only): its
    :func:`hints.outputs.disk_message`, else None. A failed run whose ranks could not say so (their reports
    are writes too) is diagnosed by this probe: a small file, allocated for real, then removed
    (:func:`hints.outputs.check_room`)."""
    try:
        check_room(root / ".rrfp-disk-probe", named=root)
    except DiskError as err:
        return str(err)
    except UserError:  # the directory itself refuses files: not the disk
        return None
    return None


def _job_name(config: RunConfig) -> str:
    from runtime.config import hint_spec
    from runtime.sched.baselines import PLANNED

    spec = hint_spec(config)
    name = Path(spec).stem if "/" in spec or spec.endswith((".json", ".csv")) else spec.replace(":", "-")
    rule = config.rule()
    budget = f"@{config.memory_budget}" if rule.uses_budget or spec == PLANNED else ""  # planned within it
    greedy = "-greedy" if rule.policy.value == "ready" and not rule.lookahead else ""
    blocking = "-blocking" if config.p2p == "blocking" else ""  # [Note: blocking p2p] in runtime.sched.fixed_order
    return f"{config.policy}{greedy}{blocking}-{name}{budget}"


def _summarise(job, rows: list[dict]) -> dict[str, Any]:
    steady = rows[1:] if len(rows) > 1 else rows  # the first iteration pays one-off costs
    return {
        "job": job.name,
        "out": job.out_dir,
        "hint": job.config.hint,
        "policy": job.config.policy,
        "rule": job.config.rule().name,
        "p2p": job.config.p2p,
        "iterations": len(rows),
        "loss_first": rows[0]["loss"],
        "loss_last": rows[-1]["loss"],
        "median_wall_seconds": statistics.median(r["wall_seconds"] for r in steady),
        "median_makespan_seconds": statistics.median(r["makespan_seconds"] for r in steady),
        "median_throughput": statistics.median(r["throughput"] for r in steady),
        "unit": rows[0]["unit"],
        "mean_idle_fraction": statistics.fmean(statistics.fmean(r["idle_fraction"]) for r in steady),
        "peak_in_flight": max(max(r["peak_in_flight"]) for r in rows),
        "trace": str(Path(job.out_dir) / "trace.pftrace") if job.recorder else None,
        "metrics": rows,
    }


def _render(console: Console, data: dict) -> None:
    jobs = data["jobs"]
    rows = [
        ("iterations", lambda s: str(s["iterations"])),
        ("first loss", lambda s: "-" if s["loss_first"] is None else f"{s['loss_first']:.4f}"),
        ("last loss", lambda s: "-" if s["loss_last"] is None else f"{s['loss_last']:.4f}"),
        ("median step time", lambda s: f"{s['median_wall_seconds'] * 1e3:.1f} ms"),
        ("median throughput", lambda s: f"{s['median_throughput']:,.0f} {s['unit']}"),
        ("mean idle (all ranks)", lambda s: f"{s['mean_idle_fraction']:.1%}"),
        ("peak in flight", lambda s: str(s["peak_in_flight"])),
    ]
    print_table(console, [Column("", text=True, key=True, style="bold"), *(Column(s["job"]) for s in jobs)],
                [[label, *(cell(s) for s in jobs)] for label, cell in rows], title=f"rrfp run -> {data['out']}")
    console.print("[dim]medians and means exclude the first iteration (one-off start-up costs); "
                  "in flight: most microbatch-chunks any rank held[/]")
    if "speedup" in data:
        line = (f"[bold]{jobs[-1]['job']}[/]: [bold green]{data['speedup']:.3f}x[/] median step time vs "
                f"[bold]{jobs[0]['job']}[/]")
        if data["speedup_vs_fixed_hint"] is not None:
            memory = ("at no more memory" if data["vs_fixed_hint_at_equal_memory"]
                      else "with more memory, so not readiness's alone")
            line += (f", [bold]{data['speedup_vs_fixed_hint']:.3f}x[/] vs [bold]{jobs[-2]['job']}[/] "
                     f"(what readiness adds to that hint, {memory})")
        if data.get("speedup_vs_best_fixed") is not None:
            line += (f", [bold]{data['speedup_vs_best_fixed']:.3f}x[/] vs [bold]{data['best_fixed_job']}[/] (the "
                     f"faster of 1F1B sorted by the same known costs and the order planned on them within the "
                     f"budget, both in fixed order: what ordering by cost and a planned split give without "
                     f"readiness)")
        peaks = ", ".join(f"{s['peak_in_flight']} ({s['job']})" for s in reversed(jobs))
        console.print(line + f"; peak in flight {peaks}")
