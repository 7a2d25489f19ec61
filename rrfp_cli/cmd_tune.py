"""``rrfp tune-hint``: search a hint (and rule, and budget) for the next run, from traces, tables or a model.

    rrfp tune-hint RUN_DIR... | --durations FILE... | --workload NAME -p P -m M [-v V] --out DIR
    rrfp tune-hint --check NEW_RUN_DIR --report DIR/report.json

Writes DIR/hint.json, DIR/job.toml (``rrfp run --config DIR/job.toml``),
DIR/report.json and DIR/report.md, into a temporary directory renamed into
place at the end, so nothing is ever written half-way. Ctrl-C stops the
search, keeps the best found and still writes the outputs (exit 130; SIGTERM
does the same with exit 143).

``--target torch`` tunes for torch's ``_PipelineScheduleRuntime``, which runs
one CSV in exactly its order every step: fixed orders only ([Note: one order
every step] in :mod:`runtime.tune.search`; ``--policy ready`` and ``auto`` are
refused), within the memory the user's schedule held (the traced run's hint,
else the shape's baseline order) unless ``--memory-budget`` says otherwise,
and it also writes DIR/schedule.csv, checked as ``rrfp hints export
--torch-csv`` checks ([Note: a CSV torch can run] in
:mod:`hints.files.torch_csv`), and DIR/torch_schedule.md (the schedule class
whose placement matches, the microbatch count, torchtitan's options, torch's
five lines).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer

from hints.errors import UserError
from rrfp_cli.options import (
    MODEL_KNOBS,
    WORKLOAD_HELP,
    WORKLOAD_METAVAR,
    BackwardRatio,
    Chunks,
    CommLatency,
    ForwardTime,
    Jitter,
    JsonFlag,
    Microbatches,
    Placement,
    PolicyChoice,
    Ranks,
    SplitOverhead,
    StragglerProb,
    StragglerSlowdown,
    Unknown,
    WorkloadChoice,
    given_flags,
    placement_value,
    variability_model,
)
from rrfp_cli.output import Column, Output, jsonable, print_table, shell_lines

TUNE = "Tuning"
SOURCE = "Scenarios (one source)"


class TargetChoice(str, Enum):
    rrfp = "rrfp"
    torch = "torch"

# RunConfig fields of a traced run that job.toml carries over (what makes the next run the same job).
_CARRIED = ("workload", "emulate", "forward_time", "backward_ratio", "jitter", "straggler_prob", "straggler_slowdown",
            "comm_latency", "comm_jitter", "samples", "hidden", "heads", "layers_per_stage", "vocab", "seq_len", "lr",
            "seed", "iters", "device", "backend", "timeout", "split_overhead", "unknown")


def tune_hint(
    ctx: typer.Context,
    runs: Annotated[Optional[list[Path]], typer.Argument(help="Traced run directories to tune on.",
                                                         metavar="[RUN_DIR]...", show_default=False)] = None,
    durations: Annotated[Optional[list[Path]], typer.Option(
        "--durations", help="Duration tables (rrfp trace export --durations) instead of traces (repeatable).",
        rich_help_panel=SOURCE)] = None,
    workload: Annotated[Optional[WorkloadChoice], typer.Option(
        "--workload", metavar=WORKLOAD_METAVAR, help=f"Tune on a duration model instead: {WORKLOAD_HELP}.",
        rich_help_panel=SOURCE)] = None,
    stages: Ranks = None,
    chunks: Chunks = None,
    microbatches: Microbatches = None,
    placement: Placement = None,
    policy: Annotated[Optional[PolicyChoice], typer.Option(
        "--policy", help="fixed: tune an order run exactly; ready: an order the best-ranked ready task follows. "
        "Default: ready, fixed with --target torch (which refuses ready).")] = None,
    memory_budget: Annotated[Optional[str], typer.Option(
        "--memory-budget", help="1f1b, 2x, a slot count, or auto (a Pareto table of makespan vs memory; "
        "job.toml takes the smallest budget within 1% of the best). Default: 1f1b; with --target torch, what "
        "your schedule held per rank (the traced run's, else 1f1b).", show_default=False)] = None,
    target: Annotated[TargetChoice, typer.Option(
        "--target", help="rrfp: a hint for rrfp run. torch: one order torch's _PipelineScheduleRuntime runs every "
        "step, tuned in fixed order, also written as DIR/schedule.csv (checked as hints export --torch-csv "
        "checks it) with DIR/torch_schedule.md (how to run it in torch and torchtitan).")] = TargetChoice.rrfp,
    objective: Annotated[str, typer.Option("--objective", help="mean, p90 (any pNN) or cvar:0.9 of the makespan.",
                                           rich_help_panel=TUNE)] = "mean",
    time_budget: Annotated[Optional[str], typer.Option(
        "--time-budget", help="Wall-clock time of the whole command, e.g. 60s, 5m: the search stops when it is "
        "spent and the best found is written. [default: 60s, none with --evaluations alone]",
        show_default=False, rich_help_panel=TUNE)] = None,
    evaluations: Annotated[Optional[int], typer.Option(
        "--evaluations", help="Stop after this many scenario simulations (one candidate on one scenario): the "
        "same result on any machine for a seed and --jobs count. report.json gives the count that reproduces a "
        "timed run. With --time-budget, whichever ends first.", show_default=False, rich_help_panel=TUNE)] = None,
    jobs: Annotated[int, typer.Option("--jobs", help="Worker processes (a search with --evaluations is the same "
                                      "for a seed and this count).", rich_help_panel=TUNE)] = 1,
    holdout: Annotated[float, typer.Option("--holdout", help="Share of the recorded iterations (the last ones) "
                                           "held out to judge the result.", rich_help_panel=TUNE)] = 0.3,
    scenarios: Annotated[int, typer.Option("--scenarios", help="Tuning scenarios (bootstrapped or sampled); as "
                                           "many again are held out.", rich_help_panel=TUNE)] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the scenarios and the search.",
                                      rich_help_panel=TUNE)] = 0,
    keep_first: Annotated[bool, typer.Option("--keep-first", help="Also tune on iteration 0 (start-up), dropped by "
                                             "default.", rich_help_panel=SOURCE)] = False,
    forward_time: ForwardTime = 0.010,
    backward_ratio: BackwardRatio = 2.0,
    jitter: Jitter = 0.0,
    straggler_prob: StragglerProb = 0.0,
    straggler_slowdown: StragglerSlowdown = 4.0,
    comm_latency: CommLatency = 0.0,
    split_overhead: SplitOverhead = None,
    unknown: Unknown = "",
    out: Annotated[Optional[Path], typer.Option("--out", help="Directory to create (must not exist).")] = None,
    check: Annotated[Optional[Path], typer.Option("--check", help="A run made with a tuned job.toml: did the "
                                                  "predicted gain materialize? (needs --report; exit 3 when it lies outside the predicted "
                                                  "range)")] = None,
    report_file: Annotated[Optional[Path], typer.Option("--report", help="The report.json of the tuning, for "
                                                        "--check.")] = None,
    json_mode: JsonFlag = False,
) -> None:
    """Tune a hint for the next run: search on scenarios from traces, tables or a model; judge on held-out ones."""
    from runtime.tune.decide import Stopwatch

    clock = Stopwatch()  # --time-budget counts from here: the scenarios, the search, the verdict and the report
    output = Output(json_mode)
    if check is not None or report_file is not None:
        if check is None or report_file is None:
            raise UserError("--check NEW_RUN_DIR and --report DIR/report.json go together", "--check")
        _check(check, report_file, output)
        return

    from runtime.tune.evaluator import Objective

    for_torch = target == TargetChoice.torch
    if for_torch and policy is not None and policy.value != "fixed":
        raise UserError(f"--target torch tunes fixed orders only: torch runs the schedule CSV in exactly its order "
                        f"every step, so a --policy {policy.value} result would not be what runs (drop --policy, "
                        "or drop --target torch to tune for rrfp run)", "--policy")
    policy = policy or (PolicyChoice.fixed if for_torch else PolicyChoice.ready)
    if policy.value == "auto":
        raise UserError("tunes a hint for fixed or ready; a tuned job.toml runs under --policy auto as well (set "
                        "policy = \"auto\")", "--policy")

    sources = [name for name, given in (("RUN_DIR", runs), ("--durations", durations), ("--workload", workload))
               if given]
    if len(sources) != 1:
        raise UserError("give one source of scenarios: RUN_DIR..., --durations FILE..., or --workload NAME "
                        f"(got {', '.join(sources) or 'none'})", "rrfp tune-hint")
    knobs = given_flags(ctx, MODEL_KNOBS) if workload is None else []
    if knobs:  # else silently ignored: traces and tables are not drawn from the model
        raise UserError("sets a --workload model's durations; traces and tables keep what they recorded", knobs[0])
    if split_overhead is not None and workload is None:
        raise UserError("prices the split of a --workload model; traces and tables keep what they recorded",
                        "--split-overhead")
    if unknown and workload is None:
        raise UserError("draws into a --workload model's durations; traces and tables keep what they recorded",
                        "--unknown")
    if out is None:
        raise UserError("give --out DIR (a new directory for hint.json, job.toml and the report)", "--out")
    out_dir = _new_directory(out)
    goal = Objective.parse(objective)
    if time_budget is not None:
        seconds = parse_duration(time_budget)
    else:  # --evaluations alone is a work budget only; neither: the default time budget
        seconds = None if evaluations is not None else DEFAULT_SECONDS
    if evaluations is not None and evaluations < 1:
        raise UserError(f"must be at least 1, got {evaluations}", "--evaluations")
    if jobs < 1:
        raise UserError(f"must be at least 1, got {jobs}", "--jobs")
    if not 0.0 < holdout < 1.0:
        raise UserError(f"must be between 0 and 1 (exclusive), got {holdout}", "--holdout")
    if scenarios < 2:
        raise UserError(f"must be at least 2, got {scenarios}", "--scenarios")
    from runtime.sched.budget import MemoryBudget

    if memory_budget not in (None, "auto"):
        MemoryBudget.parse(memory_budget)

    source = _scenarios(runs, durations, workload, stages, chunks, microbatches, holdout, scenarios, seed, keep_first,
                        variability_model(workload or WorkloadChoice.uniform, forward_time, backward_ratio, jitter,
                                          straggler_prob, straggler_slowdown, comm_latency, 0.0,
                                          split_overhead=split_overhead, unknown=unknown),
                        placement_value(placement))
    shape = source["set"].shape
    budget, budget_from = memory_budget, None
    if memory_budget is None:
        budget, budget_from = _held_budget(source, shape) if for_torch else ("1f1b", None)
    if isinstance(budget, str) and budget != "auto":
        MemoryBudget.parse(budget).per_rank(shape)

    if for_torch:  # schedule.csv is checked by torch's own lowering: import torch (seconds) inside the time budget
        _import_torch_lowering()  # now, so that the search takes what it leaves, not after the search
    from runtime.tune.decide import render_markdown, report, tune

    # The bar counts seconds of the time budget, or simulations of --evaluations alone.
    total = math.ceil(seconds) if seconds is not None else evaluations
    with output.status_progress("tuning", total) as update:
        found = [""]  # the best so far and where it was found, shown until a better one

        def progress(spent: int, best: float, note: str) -> None:
            if note and math.isfinite(best):
                found[0] = f"best {goal} {best * 1e3:.2f} ms ({note}), "
            done = min(total, int(clock.wall())) if seconds is not None else spent
            update(done, f"{found[0]}{spent:,} simulations")

        # Ctrl-C inside the search keeps the best found (stopped == "interrupted"); anywhere else it ends the
        # command with nothing written (app.main: "interrupted (SIGINT)", exit 130).
        outcome = tune(source["set"], policy.value, budget, goal, seconds, jobs, seed,
                       source["overhead"], source["cost_model"], source["traced"], progress, static=for_torch,
                       evaluations=evaluations, clock=clock)
    interrupted = outcome.search.stopped == "interrupted"
    args = sys.argv[2:] if len(sys.argv) > 2 else []
    commands = {"this tuning": "rrfp tune-hint " + " ".join(_quoted(args)),
                "the same search on any machine": "rrfp tune-hint " + " ".join(
                    _quoted(_with_evaluations(args, outcome.search.simulations))),
                "run the tuned job": f"rrfp run --config {out_dir}/job.toml",
                "check that run": f"rrfp tune-hint --check RUN_DIR --report {out_dir}/report.json"}
    data = report(outcome, {"source": source["set"].source, "inputs": source["inputs"], "commands": commands,
                            "replay": source.get("replay"), "cost_model": source["cost_model"].to_json()
                            if source["cost_model"] is not None else None,
                            "task_overhead_s": source["overhead"]})
    if for_torch:
        data["target"] = {"name": "torch", "memory_budget_from": budget_from or "--memory-budget"}
    written = _write(out_dir, outcome, data, source, for_torch)
    data["written"] = written
    for path in written.values():
        data.setdefault("files", []).append(path)
    summary = _summary_line(data)
    output.result(data, lambda console: (render_report(console, render_markdown(data)),
                                         console.print(summary, markup=False)))
    if interrupted:
        sys.stderr.write(f"stopped early: wrote the best found so far to {out_dir}\n")
        raise outcome.search.interrupt  # app.main: "interrupted (SIGINT|SIGTERM)", exit 130 / 143


# -- inputs ------------------------------------------------------------------------


def _with_evaluations(args: list[str], evaluations: int) -> list[str]:
    """``args`` with ``--evaluations N`` in place of the budgets they gave ([Note: two budgets] in
    :mod:`runtime.tune.search`): the search they ran, the same on any machine (same seed and ``--jobs``)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--time-budget", "--evaluations"):
            skip = True
        elif not arg.startswith(("--time-budget=", "--evaluations=")):
            kept.append(arg)
    return [*kept, "--evaluations", str(evaluations)]


DEFAULT_SECONDS = 60.0  # the time budget when neither --time-budget nor --evaluations is given


def parse_duration(text: str) -> float:
    """``60s``, ``5m``, ``1h`` or plain seconds; must be > 0."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", str(text))
    if not match:
        raise UserError(f"{text!r} is not a duration; use e.g. 60s, 5m or 90", "--time-budget")
    seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    if seconds <= 0:
        raise UserError(f"{text!r}: the search needs some time", "--time-budget")
    return seconds


def _new_directory(out: Path) -> Path:
    if out.exists():
        raise UserError("already exists; tune-hint writes a new directory and never overwrites one", str(out))
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"its parent {parent} is not a directory", str(out))
    from hints.outputs import new_directory_beside

    try:  # try it now (permissions, read-only or special file systems), not after the search
        new_directory_beside(out).rmdir()
    except UserError as err:  # a full or read-only disk is a DiskError (exit 1), naming the disk
        raise UserError(f"cannot write in {parent}: {err.what.removeprefix('cannot write: ')}", str(out)) from None
    return out


def _scenarios(runs, durations, workload, stages, chunks, microbatches, holdout, count, seed, keep_first, model,
               placement: str | None = None) -> dict[str, Any]:
    from hints.files.load import hint_shape
    from runtime.tune.scenarios import from_model

    asked = None
    if stages is not None and microbatches is not None:
        asked = hint_shape(None, stages, chunks, microbatches, placement)
    if runs:
        from profiler.analysis.tune_sources import from_runs

        traced = from_runs(runs, asked, holdout, count, count, seed, keep_first)
        _check_shape_flags(traced.scenarios.shape, stages, chunks, microbatches, placement)
        return {"set": traced.scenarios, "overhead": traced.overhead, "cost_model": traced.cost_model,
                "traced": _traced_candidate(traced), "replay": traced.replay, "config": traced.config,
                "meta": traced.meta, "inputs": {"runs": [str(r) for r in runs]}}
    if durations:
        if asked is None:
            raise UserError("a duration table does not know the rank count: give --ranks and --microbatches "
                            "(and --chunks)", "--durations")
        return {"set": _from_tables(durations, asked, holdout, count, seed), "overhead": 0.0, "cost_model": None,
                "traced": None, "config": None, "meta": None, "inputs": {"durations": [str(d) for d in durations]}}
    if asked is None:
        raise UserError("a workload model needs --ranks and --microbatches", "--workload")
    return {"set": from_model(model, asked, count, count, seed), "overhead": 0.0, "cost_model": None, "traced": None,
            "config": None, "meta": None, "model": model,
            "inputs": {"workload": model.workload, "model": model.__dict__}}


def _check_shape_flags(shape, stages, chunks, microbatches, placement=None) -> None:
    """Each of -p/-v/-m/--placement given beside a trace must match it (-p/-v/-m together: from_runs)."""
    for flag, given, actual in (("--ranks", stages, shape.ranks), ("--chunks", chunks, shape.chunks),
                                ("--microbatches", microbatches, shape.microbatches),
                                ("--placement", placement, shape.placement)):
        if given is not None and given != actual:
            raise UserError(f"the trace is of {shape.describe()} but {flag} {given} was asked", flag)


def _from_tables(paths, shape, holdout, count, seed):
    import polars as pl

    from runtime.durations.tables import load_durations
    from runtime.tune.scenarios import from_recorded

    recorded = []
    for path in paths:
        iterations = [None]
        try:
            frame = pl.read_parquet(path) if str(path).endswith((".parquet", ".pq")) else pl.read_csv(path)
            if "iteration" in frame.columns:
                iterations = sorted(frame.get_column("iteration").unique().to_list())
        except Exception:
            pass  # load_durations says what is wrong with the file
        for iteration in iterations:
            table = load_durations(path, shape.stages, shape.microbatches, iteration=iteration)
            recorded.append((len(recorded), table, table.expected()))
    return from_recorded(shape, recorded, holdout, count, count, seed,
                         f"{len(recorded)} recorded iterations of {', '.join(map(str, paths))}")


def _traced_candidate(traced):
    from hints.orders import BUILTIN_HINTS
    from runtime.sched.evaluate import resolve
    from runtime.tune.evaluator import Candidate

    meta, shape = traced.meta, traced.scenarios.shape
    name, rule = str(meta.get("hint")), str(meta.get("rule"))
    builtin = BUILTIN_HINTS.get(name)
    if builtin is not None and (builtin.takes_costs or builtin.takes_priorities):
        return Candidate(f"{name} (traced)", "traced", rule, builtin=name)
    if builtin is not None:
        return Candidate(f"{name} (traced)", "traced", rule, resolve(name, shape.ranks, shape.chunks,
                                                                      shape.microbatches))
    return Candidate(f"{name} (traced)", "traced", rule, traced.traced_hint)


# -- outputs -----------------------------------------------------------------------


def _held_budget(source: dict, shape):
    """``--target torch`` without ``--memory-budget``: per rank, what the user's schedule held, and what that
    was. The traced run's hint when tuning on a trace (its order's peaks in fixed order; a ready run's
    budget); else the shape's baseline order (1F1B, interleaved 1F1B, ZB-V), whose peaks are the ``1f1b``
    budget. Written as ``1f1b`` or a slot count when one says it."""
    from hints.orders import peak_in_flight
    from runtime.sched.budget import budget_spelling
    from runtime.tune.decide import HeldBudget

    traced = source.get("traced")
    if traced is None:
        return "1f1b", "the baseline order of the shape (1f1b)"
    from runtime.sched.rules import RULES

    run_budget = (source.get("meta") or {}).get("memory_budget")
    if RULES[traced.rule].uses_budget and run_budget:  # a ready run held what its arbiter let it, not its order's peak
        return str(run_budget), f"the traced run's budget ({run_budget}, under --policy ready)"
    hint = traced.hint
    if hint is None:  # a built-in rebuilt per iteration: its peaks do not depend on which microbatch goes first
        from runtime.sched.evaluate import resolve

        hint = resolve(traced.builtin, shape.ranks, shape.chunks, shape.microbatches, placement=shape.placement)
    peaks = [peak_in_flight(order, hint.shape) for order in hint.orders]
    held = f"the traced run's schedule ({hint.name})"
    return budget_spelling(shape, peaks) or HeldBudget(tuple(peaks), held), held


def _write(target: Path, outcome, data: dict, source: dict, for_torch: bool = False) -> dict[str, str]:
    """hint.json, job.toml, report.json, report.md (with ``for_torch``, schedule.csv and torch_schedule.md too):
    written in a temporary directory, then renamed to ``target``."""
    from hints.files.hint_json import save_hint
    from hints.outputs import new_directory_beside, write_error
    from runtime.sched.rules import RULES
    from runtime.tune.decide import chosen_hint, render_markdown

    candidate = outcome.verdict.chosen.candidate
    rule = RULES[candidate.rule]
    names = ["hint.json", "job.toml", "report.json", "report.md"]
    staging = new_directory_beside(target)  # the umask's permissions (mkdtemp's were 0700)
    try:
        hint = chosen_hint(outcome)
        if for_torch:  # first: a refusal leaves nothing behind
            data["target"].update(_write_torch(hint, staging, target))
            names += ["schedule.csv", "torch_schedule.md"]
        save_hint(hint, staging / "hint.json")
        job = {}
        config = source.get("config") or {}
        for key in _CARRIED:
            if config.get(key) is not None:
                job[key] = config[key]
        if source.get("model") is not None:
            model = source["model"]
            job.update(workload="emulated", emulate=model.workload, forward_time=model.forward_time,
                       backward_ratio=model.backward_ratio, jitter=model.jitter, samples=model.samples,
                       straggler_prob=model.straggler_prob, straggler_slowdown=model.straggler_slowdown,
                       comm_latency=model.comm_latency)
            if model.unknown:
                job["unknown"] = model.unknown
            from runtime.durations.presets import default_split_overhead

            if model.split_overhead != default_split_overhead(model.workload):  # else the emulated model's own
                job["split_overhead"] = model.split_overhead
        shape = outcome.evaluator.shape
        job.update(ranks=shape.ranks, chunks=shape.chunks, microbatches=shape.microbatches,
                   placement=shape.placement, hint=candidate.builtin or "hint.json", policy=str(rule.policy),
                   memory_budget=_toml_budget(outcome))
        if rule.policy.value == "ready":
            job["lookahead"] = rule.lookahead
        _write_toml(staging / "job.toml", job, data, target)
        (staging / "report.json").write_text(json.dumps(jsonable(data), indent=1) + "\n")
        (staging / "report.md").write_text(render_markdown(data))
        os.rename(staging, target)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, OSError):  # a full disk names the disk ([Note: outputs written whole] in hints.outputs)
            raise write_error(err, target) from None
        raise
    return {name: str(target / name) for name in names}


def _import_torch_lowering() -> None:
    """Import what the CSV's check imports (hints.files.torch_csv), if it is there."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.distributed.pipelining import schedules  # noqa: F401
    except ImportError:
        pass


def _write_torch(hint, staging: Path, target: Path) -> dict[str, Any]:
    """schedule.csv (only if torch can run it) and torch_schedule.md in ``staging``; what the report says of them."""
    from hints.files.torch_csv import export_torch_csv, torch_schedule_name, torch_schedule_notes
    from runtime.sched.simulator import check_completes

    final_csv = (target / "schedule.csv").resolve()  # torchtitan reads it from its own working directory
    version = export_torch_csv(hint, staging / "schedule.csv", check_completes)
    (staging / "torch_schedule.md").write_text(torch_schedule_notes(hint, str(final_csv), version))
    return {"csv": str(target / "schedule.csv"), "notes": str(target / "torch_schedule.md"),
            "schedule": torch_schedule_name(hint.shape), "microbatches": hint.shape.microbatches,
            "torch_lowering": version}


def _toml_budget(outcome) -> str:
    """job.toml's memory-budget: the tuned budget, or its largest slot count when no spelling says it per rank
    (a budget held by the user's own schedule; the fixed policy job.toml runs under reads none)."""
    from runtime.sched.budget import MemoryBudget

    try:
        MemoryBudget.parse(outcome.budget)
        return outcome.budget
    except UserError:
        return str(max(outcome.evaluator.slots))


def _write_toml(path: Path, values: dict, data: dict, target: Path) -> None:
    verdict = data["verdict"]
    lines = [f"# Written by rrfp tune-hint: rrfp run --config {target}/job.toml", f"# {verdict['reason']}"]
    for key, value in values.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = json.dumps(str(value))
        lines.append(f"{name} = {text}")
    path.write_text("\n".join(lines) + "\n")


def _quoted(args: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in args]


def _summary_line(data: dict) -> str:
    v, p = data["verdict"], data["prediction"]
    line = f"wrote {data['written']['job.toml']}: {v['hint']} ({v['rule']})"
    gain = p.get("gain_over_fixed_1f1b")
    if gain:
        from runtime.tune.decide import baseline_label

        shape = data["shape"]
        line += (f", predicted {gain['estimate']:+.1%} over {baseline_label(shape['chunks'], shape['placement'])} "
                 "on held-out scenarios")
    torch = data.get("target") or {}
    if torch.get("csv"):
        line += f"; for torch: {torch['csv']} (how to run it: {torch['notes']})"
    return line + f"; check a run of it with: rrfp tune-hint --check RUN --report {data['written']['report.json']}"


def render_report(console, markdown: str) -> None:
    """report.md for the terminal ([Note: tables at 80 columns] in rrfp_cli.output): its tables through
    ``print_table``, its commands as shell lines that fit, its prose wrapped."""
    from rich.text import Text

    for kind, lines in _blocks(markdown.splitlines()):
        if kind == "table":
            _markdown_table(console, lines)
        elif kind == "code":
            for command in lines:
                console.print(shell_lines(command, console.width), markup=False, soft_wrap=True)
        else:
            line = lines[0]
            heading = line.startswith("#")
            console.print(Text(line.lstrip("# ") if heading else line.replace("**", ""),
                               style="bold" if heading else ""))


def _blocks(lines: list[str]) -> Iterator[tuple[str, list[str]]]:
    """Markdown as ("table", rows), ("code", lines inside a fence) and ("line", [line])."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("|"):
            end = next((j for j in range(i, len(lines)) if not lines[j].startswith("|")), len(lines))
            yield "table", lines[i:end]
        elif lines[i].startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            yield "code", lines[i + 1:end]
            end += 1
        else:
            end = i + 1
            yield "line", [lines[i]]
        i = end


def _markdown_table(console, lines: list[str]) -> None:
    """A markdown table (header, rule, rows); a column whose every cell is in ms shows bare numbers, unit above."""
    header, *rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    rows = [row for row in rows if not all(set(cell) <= set("-:") for cell in row)]
    in_ms = [bool(rows) and all(row[i].endswith(" ms") for row in rows) for i in range(len(header))]
    rows = [[cell.removesuffix(" ms") if ms else cell for cell, ms in zip(row, in_ms)] for row in rows]
    text = [not all(_numeric(row[i]) for row in rows) for i in range(len(header))]
    columns = [Column(name, text=is_text, key=i == 0) for i, (name, is_text) in enumerate(zip(header, text))]
    print_table(console, columns, rows, title="times in ms" if any(in_ms) else None)


def _numeric(cell: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,.]+(x|%)?|-", cell))


# -- --check ------------------------------------------------------------------------
#
# [Note: a check that fails]
# ``--check`` exits 0 when the run's median makespan (and, when the report has one, its gain over the traced
# run) lies in the predicted range, and CHECK_FAILED (3) when either lies outside it: the result is still printed
# whole (or as JSON, with ``passed``: false), and one ``check failed:`` line on stderr says what missed. 3 is
# neither bad input (2), nor a failed job or an internal error (1), nor an interrupt (130, 143), so a script
# can tell a prediction that missed from a check that could not be made.

CHECK_FAILED = 3


def _check(run: Path, report_path: Path, output: Output) -> None:
    from profiler.analysis.windows import complete_iterations, iteration_windows
    from profiler.trace.reader import read_trace
    from runtime.tune.decide import gain_range

    try:
        data = json.loads(report_path.read_text())
    except FileNotFoundError:
        raise UserError("no such file", str(report_path)) from None
    except UnicodeDecodeError:  # a binary file (a trace given as the report)
        raise UserError("not a tune-hint report: not text (report.json is JSON)", str(report_path)) from None
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"not a tune-hint report: {err}", str(report_path)) from None
    if not isinstance(data, dict) or data.get("format") != "rrfp-tune-report/1":
        raise UserError("not a tune-hint report (format rrfp-tune-report/1)", str(report_path))
    frames = read_trace(run)
    meta = next(iter(frames.meta.values()))
    shape = data["shape"]
    if (int(meta["stages"]), int(meta["chunks"]), int(meta["microbatches"])) != \
            (shape["ranks"], shape["chunks"], shape["microbatches"]):
        raise UserError(f"the run is of {meta['stages']} ranks x {meta['chunks']} chunks, {meta['microbatches']} "
                        f"microbatches but the report tuned {shape['ranks']} x {shape['chunks']}, "
                        f"{shape['microbatches']}", str(run))
    complete = complete_iterations(frames)
    steady = complete[1:] if len(complete) > 1 else complete
    windows = {i: ns * 1e-9 for i, ns in iteration_windows(frames).select("iteration", "makespan_ns").iter_rows()}
    measured = statistics.median(windows[i] for i in steady)
    prediction = data["prediction"]
    low, high = prediction["makespan_range"]
    result: dict[str, Any] = {"run": str(run), "iterations": steady, "measured_makespan_s": measured,
                              "predicted_range_s": [low, high], "predicted_mean_s": prediction["makespan"]["mean"],
                              "within_predicted_range": low <= measured <= high}
    replay = data.get("replay")
    gain = prediction.get("gain_over_traced_hint")
    if replay and gain and replay.get("measured_s"):
        realized = (replay["measured_s"] - measured) / replay["measured_s"]
        low_gain, high_gain = gain_range(gain)
        result.update(realized_gain_over_traced=realized, predicted_gain_range=[low_gain, high_gain],
                      gain_within_predicted_range=low_gain <= realized <= high_gain)
    missed = [what for what, key in (("median makespan", "within_predicted_range"),
                                     ("gain over the traced run", "gain_within_predicted_range"))
              if result.get(key) is False]
    result["passed"] = not missed

    def render(console) -> None:
        verdict = "inside" if result["within_predicted_range"] else "OUTSIDE"
        console.print(f"{run}: median makespan {measured * 1e3:.2f} ms over iterations {steady[0]}..{steady[-1]}; "
                      f"predicted {prediction['makespan']['mean'] * 1e3:.2f} ms (p10..p90 {low * 1e3:.2f}.."
                      f"{high * 1e3:.2f} ms): {verdict} the predicted range", markup=False)
        if "realized_gain_over_traced" in result:
            inside = "inside" if result["gain_within_predicted_range"] else "OUTSIDE"
            console.print(f"gain over the traced run: {result['realized_gain_over_traced']:+.1%}; predicted "
                          f"{gain['estimate']:+.1%} (range {low_gain:+.1%}..{high_gain:+.1%}): "
                          f"{inside}", markup=False)

    output.result(result, render)
    if missed:  # [Note: a check that fails]
        sys.stderr.write(f"check failed: the {' and the '.join(missed)} of {run} "
                         f"{'lies' if len(missed) == 1 else 'lie'} outside the predicted range (exit {CHECK_FAILED})\n")
        raise typer.Exit(CHECK_FAILED)


__all__ = ["parse_duration", "tune_hint"]
