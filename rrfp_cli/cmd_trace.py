"""``rrfp trace``: answers from a run's Perfetto trace (bubbles, misalignment, critical path, hint sensitivity)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from rrfp_cli.output import Output

if TYPE_CHECKING:  # polars is imported by the commands, so `rrfp --help` stays fast
    import polars as pl

app = typer.Typer(help="Read a run's trace: bubbles, misalignment, critical path, hint sensitivity, decisions.",
                  no_args_is_help=True)

RunArg = Annotated[Path, typer.Argument(help="Run directory or .pftrace file.", metavar="RUN")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
Iteration = Annotated[Optional[int], typer.Option("--iteration", "-i", min=0,
                                                  help="One iteration (default: see each command).")]


def _load(run: Path, out: Output):
    from profiler.reader import read_trace

    frames = read_trace(run)
    for warning in frames.warnings:
        out.note(f"[yellow]warning:[/] {warning}")
    return frames


def _table(console: Console, frame: pl.DataFrame, title: str, formats: dict[str, str] | None = None) -> None:
    import polars as pl

    formats = formats or {}
    table = Table(title=title, title_justify="left")
    for column in frame.columns:
        table.add_column(column, justify="left" if frame.schema[column] == pl.Utf8 else "right")
    for row in frame.iter_rows():
        table.add_row(*(_cell(value, formats.get(column)) for column, value in zip(frame.columns, row)))
    console.print(table)


def _cell(value, fmt: str | None) -> str:
    if value is None:
        return "-"
    if fmt:
        return format(value, fmt)
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def _ms(frame: pl.DataFrame, columns) -> pl.DataFrame:
    """ns columns -> ms columns, for tables people read."""
    import polars as pl

    return frame.with_columns([(pl.col(c) / 1e6).alias(c.replace("_ns", "_ms")) for c in columns]).drop(columns)


@app.command("summary")
def summary_command(run: RunArg, json_mode: JsonFlag = False) -> None:
    """What ran, how long an iteration took, and where idle time went."""
    from profiler.analysis import summary

    out = Output(json_mode)
    data = summary(_load(run, out))

    def render(console: Console) -> None:
        table = Table(title=f"trace {data['trace']}", title_justify="left", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for key in ("job", "workload", "shape", "policy", "hint", "memory_budget", "timing", "iterations"):
            table.add_row(key, str(data[key]))
        table.add_row("median makespan", f"{data['median_makespan_s'] * 1e3:.2f} ms")
        table.add_row("utilization", f"{data['utilization']:.1%}")
        table.add_row("idle time", ", ".join(f"{k} {v:.0%}" for k, v in data["idle_share"].items()))
        table.add_row("hint skips", f"{data['skips']} (mean Kendall tau {data['mean_kendall_tau']:.3f})")
        table.add_row("clock alignment", f"within {data['max_clock_error_ns'] / 1e3:.1f} us")
        console.print(table)

    out.result(data, render)


@app.command("bubbles")
def bubbles_command(
    run: RunArg,
    per_iteration: Annotated[bool, typer.Option("--per-iteration", help="One row per rank and iteration.")] = False,
    json_mode: JsonFlag = False,
) -> None:
    """Per rank: utilization and idle time split into fill, drain, dependency wait, misalignment, overhead."""
    from profiler.analysis import BUBBLE_COLUMNS, bubble_totals, bubbles

    out = Output(json_mode)
    frame = bubbles(_load(run, out))
    shown = frame if per_iteration else bubble_totals(frame)
    columns = ["makespan_ns", "busy_ns", *BUBBLE_COLUMNS]
    out.result(shown.to_dicts(), lambda console: _table(
        console, _ms(shown, columns), "time per rank (ms, summed over traced iterations); "
        "misalignment = idle while another task was ready", {"utilization": ".1%"}))


@app.command("misalign")
def misalign_command(
    run: RunArg,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the longest N gaps.")] = 20,
    json_mode: JsonFlag = False,
) -> None:
    """The idle gaps where a rank waited although another of its tasks was ready (longest first)."""
    import polars as pl

    from profiler.analysis import misalignment_gaps

    out = Output(json_mode)
    frames = _load(run, out)
    from profiler.analysis import iteration_windows

    gaps = misalignment_gaps(frames)
    per_rank = gaps.group_by("rank").agg(pl.col("misaligned_ns").sum(), pl.len().alias("gaps")).sort("rank")
    windows = iteration_windows(frames).select("iteration", pl.col("start_ns").alias("window_ns"))
    top = gaps.head(limit).join(windows, on="iteration").with_columns(
        (pl.col("gap_end_ns") - pl.col("window_ns")).alias("at_ns")).drop("window_ns")

    def render(console: Console) -> None:
        _table(console, _ms(per_rank, ["misaligned_ns"]), "misaligned time per rank (ms)")
        shown = _ms(top.select("rank", "iteration", "at_ns", "misaligned_ns", "ran_next", "ready"),
                    ["at_ns", "misaligned_ns"])
        _table(console, shown, f"longest {len(top)} misaligned gaps: at `at_ms` into the iteration the rank ran "
                               f"`ran_next` after idling while `ready` could have run")

    out.result({"per_rank": per_rank.to_dicts(), "gaps": top.to_dicts()}, render)


@app.command("critical-path")
def critical_path_command(run: RunArg, iteration: Iteration = None, json_mode: JsonFlag = False) -> None:
    """The chain of compute, transfers and waits that set an iteration's makespan (default: the last)."""
    from profiler.analysis import critical_path

    out = Output(json_mode)
    path = critical_path(_load(run, out), iteration)
    shares = path.shares()
    data = {"iteration": path.iteration, "makespan_ns": path.makespan_ns, "shares": shares,
            "segments": path.segments.to_dicts()}

    def render(console: Console) -> None:
        _table(console, _ms(path.segments, ["start_ns", "end_ns", "duration_ns"]).drop("start_ms", "end_ms"),
               f"critical path of iteration {path.iteration} ({path.makespan_ns / 1e6:.2f} ms)")
        console.print("share of the makespan: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))

    out.result(data, render)


@app.command("sensitivity")
def sensitivity_command(
    run: RunArg,
    iteration: Iteration = None,
    iterations: Annotated[Optional[str], typer.Option(
        "--iterations", help="A:B: replay iterations A..B-1 (default: every complete one after the first, "
        "which pays for start-up).")] = None,
    task_overhead: Annotated[Optional[float], typer.Option(
        "--task-overhead", help="Seconds of dispatch cost per task in every replay (default: calibrated from "
        "this trace).")] = None,
    json_mode: JsonFlag = False,
) -> None:
    """Replay the trace's realized durations under its own hint and every built-in, fixed and ready."""
    from hints.errors import UserError
    from profiler.analysis import sensitivity, traced_iterations

    if iteration is not None and iterations is not None:
        raise UserError("give --iteration or --iterations, not both", "--iterations")
    if task_overhead is not None and not task_overhead >= 0:
        raise UserError(f"must be a number >= 0, got {task_overhead}", "--task-overhead")
    out = Output(json_mode)
    frames = _load(run, out)
    chosen = None
    if iteration is not None:
        chosen = [iteration]
    elif iterations is not None:
        start, stop = _iteration_window(iterations)
        chosen = [i for i in traced_iterations(frames) if i >= start and (stop is None or i < stop)]
        if not chosen:
            raise UserError(f"no traced iteration in {iterations}", "--iterations")
    result = sensitivity(frames, chosen, task_overhead)
    data = result.to_json()

    def render(console: Console) -> None:
        table = Table(title=f"hint sensitivity at the traced budget ({result.budget}): realized durations of "
                            f"iteration(s) {_ranges(result.iterations)} replayed (medians)", title_justify="left")
        for column in ("hint", "rule", "simulated", "vs traced", "vs 1F1B", "/ bound"):
            table.add_column(column, justify="left" if column in ("hint", "rule") else "right")
        own = result.rows[0].makespan
        for row in result.rows:
            table.add_row(row.hint, row.label + ("" if row.within_budget else " (over budget)"),
                          f"{row.makespan * 1e3:.2f} ms", f"{own / row.makespan:.3f}x", f"{row.speedup:.3f}x",
                          f"{row.over_bound:.3f}")
        console.print(table)
        errors = list(result.errors.values())
        source = (f"calibrated from {result.overhead.samples} dispatches" if result.overhead is not None
                  else "given")
        console.print(f"measured {data['measured_makespan_s'] * 1e3:.2f} ms (median); the traced hint replayed "
                      f"with {result.overhead_s * 1e6:.0f} us dispatch overhead per task ({source}) is off by "
                      f"{min(errors):+.1%} .. {max(errors):+.1%} per iteration")

    out.result(data, render)


@app.command("decisions")
def decisions_command(
    run: RunArg,
    rank: Annotated[Optional[int], typer.Option("--rank", min=0, help="Only this rank.")] = None,
    iteration: Iteration = None,
    skipped: Annotated[bool, typer.Option("--skipped", help="Only decisions that passed over the hint head.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N rows.")] = 50,
    json_mode: JsonFlag = False,
) -> None:
    """The arbiter's decisions: ready set with hint ranks, the choice, the hint head it skipped."""
    import polars as pl

    out = Output(json_mode)
    frame = _load(run, out).decisions
    if rank is not None:
        frame = frame.filter(pl.col("rank") == rank)
    if iteration is not None:
        frame = frame.filter(pl.col("iteration") == iteration)
    if skipped:
        frame = frame.filter(pl.col("skipped").is_not_null())
    total = frame.height
    frame = frame.head(limit)
    shown = frame.select(
        "rank", "iteration", "chosen", "hint_rank", "skipped",
        ((pl.col("time_ns") - pl.col("waited_from_ns")) / 1e6).alias("waited_ms"), "in_flight",
        pl.col("ready").str.split(" ").list.len().alias("ready_n"),
        pl.col("ready").str.split(" ").list.head(4).list.join(" ").alias("ready_first4"),
        "held_back")
    out.result({"total": total, "decisions": frame.to_dicts()},
               lambda console: _table(console, shown, f"{len(frame)} of {total} decisions"))


@app.command("compare")
def compare_command(
    a: Annotated[Path, typer.Argument(help="Run directory or trace (the baseline).", metavar="A")],
    b: Annotated[Path, typer.Argument(help="Run directory or trace.", metavar="B")],
    json_mode: JsonFlag = False,
) -> None:
    """Two runs side by side: makespan, utilization, idle time per rank and iteration by category."""
    from profiler.analysis import compare

    out = Output(json_mode)
    import polars as pl

    frame = compare(_load(a, out), _load(b, out))
    seconds = [c for c in frame.columns if c.endswith("_s")]
    shown = frame.drop("trace").with_columns([(pl.col(c) * 1e3).alias(c[:-2] + "_ms") for c in seconds]).drop(seconds)
    out.result(frame.to_dicts(), lambda console: _table(
        console, shown, f"A = {a}, B = {b} (idle columns: ms per rank and iteration)",
        {"utilization": ".1%", "speedup_vs_A": ".3f"}))


@app.command("export")
def export_command(
    run: RunArg,
    parquet: Annotated[Optional[Path], typer.Option(
        "--parquet", help="Directory for the frames as Parquet files (tasks, decisions, transfers, counters, "
        "iterations) plus meta.json.")] = None,
    durations: Annotated[Optional[Path], typer.Option(
        "--durations", help="Write the realized task durations and message latencies of the complete "
        "iterations as a duration table (.csv, .parquet or .pq) that `rrfp simulate --durations` replays.")] = None,
    iterations: Annotated[Optional[str], typer.Option(
        "--iterations", help="A:B: only iterations A..B-1 into --durations (either side may be left out; "
        "default all complete ones). Iteration 0 includes start-up: --iterations 1: leaves it out.")] = None,
    json_mode: JsonFlag = False,
) -> None:
    """Write the trace's frames as Parquet (--parquet), its realized durations as a table (--durations), or both."""
    from hints.errors import UserError

    if parquet is None and durations is None:
        raise UserError("give --parquet DIR, --durations FILE, or both", "rrfp trace export")
    if iterations is not None and durations is None:
        raise UserError("applies to --durations only", "--iterations")
    window = _iteration_window(iterations)
    if durations is not None:
        from runtime.duration_tables import check_destination

        check_destination(durations)  # before reading the trace: a bad path fails fast
    out = Output(json_mode)
    frames = _load(run, out)
    data: dict = {"written": []}
    if parquet is not None:
        parquet.mkdir(parents=True, exist_ok=True)
        for name, frame in frames.frames().items():
            frame.write_parquet(parquet / f"{name}.parquet")
            data["written"].append(str(parquet / f"{name}.parquet"))
        (parquet / "meta.json").write_text(json.dumps(frames.meta, indent=1))
        data["written"].append(str(parquet / "meta.json"))
    if durations is not None:
        data["durations"] = _export_durations(frames, durations, window)
        data["written"].append(str(durations))

    def render(console: Console) -> None:
        frame_files = [w for w in data["written"] if w != str(durations)]
        if frame_files:
            console.print("wrote " + ", ".join(frame_files), markup=False)
        table = data.get("durations")
        if table:
            its = table["iterations"]
            console.print(f"wrote {table['file']}: {table['task_rows']} task rows of {len(its)} iteration"
                          f"{'s' if len(its) != 1 else ''} ({_ranges(its)}); latencies: {table['latencies_measured']} "
                          f"measured, {table['latencies_filled']} filled with the iteration's median",
                          markup=False)
            console.print(f"replay one: {table['replay']}", markup=False, soft_wrap=True)  # one line to copy

    out.result(data, render)


def _iteration_window(spec: str | None) -> tuple[int, int | None]:
    """``--iterations A:B`` as ``(A, B)``; ``B`` None means to the end."""
    from runtime.config import parse_window

    return parse_window(spec, "--iterations")


def _export_durations(frames, path: Path, window: tuple[int, int | None]) -> dict:
    import shlex

    from hints.errors import UserError
    from profiler.analysis import pipeline_shape, realized_iterations
    from runtime.duration_tables import write_durations

    start, stop = window
    complete = realized_iterations(frames)  # every complete iteration; the window picks among them
    realized = [r for r in complete if r.iteration >= start and (stop is None or r.iteration < stop)]
    if not realized:
        raise UserError(f"no complete iteration in {start}:{'' if stop is None else stop} "
                        f"(complete: {_ranges([r.iteration for r in complete])})", "--iterations")
    rows = write_durations(path, [(r.iteration, r.durations) for r in realized])
    shape = pipeline_shape(frames)
    meta = next(iter(frames.meta.values()))
    replay = ["rrfp", "simulate", "--durations", str(path), "--durations-iteration", str(realized[0].iteration),
              "--stages", str(shape.ranks), "--chunks", str(shape.chunks), "--microbatches", str(shape.microbatches),
              "--hint", str(meta.get("hint")), "--policy", str(meta.get("policy"))]
    if meta.get("policy") == "ready":
        replay += ["--memory-budget", str(meta.get("memory_budget"))]
        # Traces older than the lookahead rule (no "rule") ran greedy readiness.
        replay += ["--lookahead", "on" if meta.get("rule") == "lookahead" else "off"]
    return {"file": str(path), "iterations": [r.iteration for r in realized], "task_rows": rows,
            "latencies_measured": sum(len(r.measured) for r in realized),
            "latencies_filled": sum(len(r.filled) for r in realized),
            "replay": shlex.join(replay)}


def _ranges(values: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1..3, 7``."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


@app.command("timeline")
def timeline_command(
    run: RunArg,
    png: Annotated[Path, typer.Option("--png", help="Where to write the picture.")],
    iteration: Iteration = None,
    width: Annotated[int, typer.Option("--width", min=400, help="Width in pixels.")] = 1600,
    json_mode: JsonFlag = False,
) -> None:
    """A static PNG of one iteration (default: the last): ranks as rows, tasks coloured by microbatch."""
    from profiler.timeline import save_timeline

    out = Output(json_mode)
    path = save_timeline(_load(run, out), png, iteration, width)
    out.result({"png": str(path)}, lambda console: console.print(f"wrote {path}"))


@app.command("merge")
def merge_command(
    run: Annotated[Path, typer.Argument(help="Run directory with trace/rank*.pftrace.", metavar="RUN")],
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Default RUN/trace.pftrace.")] = None,
    json_mode: JsonFlag = False,
) -> None:
    """Merge per-rank traces into one (rrfp run does this itself unless it crashed)."""
    from hints.errors import UserError
    from profiler.recorder import merge_traces
    from profiler.schema import rank_trace_files

    files = rank_trace_files(run)
    if not files:
        raise UserError("has no trace/rank*.pftrace files to merge", str(run))
    target = merge_traces(files, out_file or run / "trace.pftrace")
    Output(json_mode).result({"merged": [str(f) for f in files], "out": str(target)},
                             lambda console: console.print(f"merged {len(files)} rank traces into {target}"))
