"""``rrfp trace``: answers from a run's Perfetto trace (bubbles, misalignment, critical path, hint sensitivity).

The analyses (``summary``, ``bubbles``, ``misalign``, ``critical-path``, ``sensitivity``, ``decisions``) given
an ``rrfp run --compare`` directory answer for each of its jobs (:func:`_answer`); the commands that need one
trace refuse it and name its jobs (``profiler.trace.reader.locate_trace``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.text import Text

from rrfp_cli.helpscreen import App
from rrfp_cli.output import Column, Output, check_new_file, print_pairs, print_table

if TYPE_CHECKING:  # polars is imported by the commands, so `rrfp --help` stays fast
    import polars as pl

    from profiler.trace.reader import TraceFrames

app = App(help="Read a run's trace: bubbles, misalignment, critical path, hint sensitivity, decisions.",
          no_args_is_help=True)

RunArg = Annotated[Path, typer.Argument(help="Run directory or .pftrace file.", metavar="RUN")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
Iteration = Annotated[Optional[int], typer.Option("--iteration", "-i", min=0,
                                                  help="One iteration (default: see each command).")]
Iterations = Annotated[Optional[str], typer.Option(
    "--iterations", help="A:B: only iterations A..B-1 (either side may be left out). Default: every traced "
    "iteration but 0, which pays for start-up (unless it is the only one).")]
Force = Annotated[bool, typer.Option("--force", help="Overwrite output files that exist.")]


def _load(run: Path, out: Output, iteration: int | None = None, iterations: str | None = None, select: bool = True):
    """Read the trace, warn, and keep the chosen iterations ([Note: iteration 0] in profiler.analysis.windows)."""
    from profiler.analysis.windows import select_iterations
    from profiler.trace.cache import keep
    from profiler.trace.reader import read_trace

    window, flag = _window(iteration, iterations)
    frames = read_trace(run)
    out.on_success(lambda whole=frames: keep(whole))  # [Note: the frames cache]: only once the result is out
    for warning in frames.warnings:
        out.warn(warning)
    if not select:
        return frames
    frames, notes = select_iterations(frames, window, flag)
    for note in notes:
        out.warn(note)
    return frames


def _window(iteration: int | None, iterations: str | None) -> tuple[tuple[int, int | None] | None, str]:
    """``-i N`` or ``--iterations A:B`` as a window and the flag to blame; None for the default."""
    from hints.errors import UserError

    if iteration is not None and iterations is not None:
        raise UserError("give --iteration or --iterations, not both", "--iterations")
    if iteration is not None:
        return (iteration, iteration + 1), "--iteration"
    return (None if iterations is None else _iteration_window(iterations)), "--iterations"


def _iteration_window(spec: str | None) -> tuple[int, int | None]:
    """``--iterations A:B`` as ``(A, B)``; ``B`` None means to the end."""
    from runtime.config import parse_window

    return parse_window(spec, "--iterations")


def _emit(out: Output, data: dict, render) -> None:
    """The command's result; its JSON carries every warning the reader and the selection gave."""
    out.result({**data, "warnings": out.warnings}, render)


Answer = Callable[["TraceFrames"], tuple[dict, Callable[[Console], None]]]


def _answer(run: Path, out: Output, answer: Answer, iteration: int | None = None,
            iterations: str | None = None) -> None:
    """``answer`` on the run's trace, or on each job's of a ``--compare`` run directory: a section per job, and
    in JSON ``{"jobs": [{"job", "run", ...the answer, "warnings"}], "warnings"}``."""
    from profiler.trace.reader import job_runs

    jobs = job_runs(run)
    if not jobs:
        _emit(out, *answer(_load(run, out, iteration, iterations)))
        return
    answers = []
    for job in jobs:
        first = len(out.warnings)
        data, render = answer(_load(job, out, iteration, iterations))
        answers.append(({"job": job.name, "run": str(job), **data, "warnings": out.warnings[first:]}, render))

    def render_all(console: Console) -> None:
        for data, render in answers:
            console.print(Text(f"job {data['job']} ({data['run']})", style="bold"))
            render(console)

    _emit(out, {"jobs": [data for data, _ in answers]}, render_all)


def _table(console: Console, frame: pl.DataFrame, title: str, formats: dict[str, str] | None = None,
           keys: tuple[str, ...] = ("rank",), caption: str | None = None) -> None:
    """A frame as a table ([Note: tables at 80 columns] in rrfp_cli.output); its units go in ``title``."""
    import polars as pl

    formats = formats or {}
    columns = [Column(_header(name), text=frame.schema[name] == pl.Utf8, key=name in keys) for name in frame.columns]
    rows = [[_cell(value, formats.get(name)) for name, value in zip(frame.columns, row)] for row in frame.iter_rows()]
    print_table(console, columns, rows, title=title, caption=caption)


def _header(name: str) -> str:
    """A frame column's name as header words: ``budget_held_ms`` -> ``budget held`` (the unit is in the title)."""
    for unit in ("_ms", "_ns", "_s"):
        name = name.removesuffix(unit)
    return name.replace("_", " ")


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
def summary_command(run: RunArg, iterations: Iterations = None, json_mode: JsonFlag = False) -> None:
    """What ran, how long an iteration took, and where idle time went."""
    from profiler.analysis.summary import summary

    def answer(frames):
        data = summary(frames)
        return data, lambda console: _render_summary(console, data)

    _answer(run, Output(json_mode), answer, iterations=iterations)


def _render_summary(console: Console, data: dict) -> None:
    pairs = [(key.replace("_", " "), str(data[key]))
             for key in ("job", "workload", "shape", "backward", "grid", "policy", "p2p", "hint", "memory_budget",
                         "timing")
             if data.get(key) is not None or key != "grid"]
    makespan = data["median_makespan_s"]
    pairs += [
        ("iterations", f"{data['iterations']} ({_ranges(data['iteration_numbers'])})"),
        ("median makespan", _cell(makespan and makespan * 1e3, ".2f") + " ms"),
        ("utilization", _cell(data["utilization"], ".1%")),
        ("idle time", ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in data["idle_share"].items())),
        ("hint skips", f"{data['skips']} (mean Kendall tau {_cell(data['mean_kendall_tau'], '.3f')})"),
        ("clock alignment", f"within {data['max_clock_error_ns'] / 1e3:.1f} us"),
    ]
    if data.get("source") == "torch-profiler":  # [Note: what a torch trace cannot say]
        pairs[-2:] = [("source", "torch profiler traces (rrfp trace import): torch ran its order; no arbiter "
                                 "decisions, counters or message sizes"),
                      ("clock alignment", "the profiler's clock (one host), not measured")]
    if data.get("auto"):
        auto = data["auto"]
        pairs.append(("auto policy", f"{auto['fixed_iterations']} of {len(auto['rules'])} iterations fixed, "
                                     f"{auto['switches']} switch(es); why: on each iteration's slice and in "
                                     "metrics' policy column"))
    print_pairs(console, pairs, f"trace {data['trace']}")


@app.command("bubbles")
def bubbles_command(
    run: RunArg,
    per_iteration: Annotated[bool, typer.Option("--per-iteration", help="One row per rank and iteration.")] = False,
    iterations: Iterations = None,
    json_mode: JsonFlag = False,
) -> None:
    """Per rank: utilization and idle time split into fill, drain, optimizer step, dependency wait, budget-held,
    dispatch and misalignment."""
    from profiler.analysis.bubbles import BUBBLE_COLUMNS, bubble_totals, bubbles

    def answer(frames):
        frame = bubbles(frames)
        shown = frame if per_iteration else bubble_totals(frame)
        return {"rows": shown.to_dicts()}, lambda console: _table(
            console, _ms(shown, ["makespan_ns", "busy_ns", *BUBBLE_COLUMNS]), "time per rank in ms"
            + ("" if per_iteration else ", summed over the iterations"), {"utilization": ".1%"},
            ("rank", "iteration"), "misalignment: idle beyond the dispatch cost while a task the budget allowed "
            "was ready")

    _answer(run, Output(json_mode), answer, iterations=iterations)


@app.command("misalign")
def misalign_command(
    run: RunArg,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the longest N gaps.")] = 20,
    iterations: Iterations = None,
    json_mode: JsonFlag = False,
) -> None:
    """The idle gaps where a rank waited although another of its tasks was ready (longest first)."""
    import polars as pl

    from profiler.analysis.bubbles import misalignment_gaps
    from profiler.analysis.windows import iteration_windows

    def answer(frames):
        gaps = misalignment_gaps(frames)
        per_rank = gaps.group_by("rank").agg(pl.col("misaligned_ns").sum(), pl.len().alias("gaps")).sort("rank")
        windows = iteration_windows(frames).select("iteration", pl.col("start_ns").alias("window_ns"))
        top = gaps.head(limit).join(windows, on="iteration").with_columns(
            (pl.col("gap_end_ns") - pl.col("window_ns")).alias("at_ns")).drop("window_ns")

        def render(console: Console) -> None:
            _table(console, _ms(per_rank, ["misaligned_ns"]), "misaligned time per rank in ms")
            shown = _ms(top.select("rank", "iteration", "at_ns", "misaligned_ns", "ran_next", "ready"),
                        ["at_ns", "misaligned_ns"])
            _table(console, shown, f"longest {len(top)} misaligned gaps, in ms: `at` ms into the iteration the "
                                   f"rank ran `ran next` after idling `misaligned` ms while `ready` could have run",
                   keys=("rank", "iteration"))

        return {"per_rank": per_rank.to_dicts(), "gaps": top.to_dicts()}, render

    _answer(run, Output(json_mode), answer, iterations=iterations)


@app.command("critical-path")
def critical_path_command(run: RunArg, iteration: Iteration = None, iterations: Iterations = None,
                          json_mode: JsonFlag = False) -> None:
    """The chain of compute, transfers and waits that set an iteration's makespan (default: the last)."""
    from profiler.analysis.critical_path import critical_path

    def answer(frames):
        path = critical_path(frames)
        shares = path.shares()

        def render(console: Console) -> None:
            _table(console, _ms(path.segments, ["start_ns", "end_ns", "duration_ns"]).drop("start_ms", "end_ms"),
                   f"critical path of iteration {path.iteration} ({path.makespan_ns / 1e6:.2f} ms; durations in "
                   f"ms)", keys=())
            console.print("share of the makespan: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))

        return {"iteration": path.iteration, "makespan_ns": path.makespan_ns, "shares": shares,
                "segments": path.segments.to_dicts()}, render

    _answer(run, Output(json_mode), answer, iteration, iterations)


@app.command("sensitivity")
def sensitivity_command(
    run: RunArg,
    iteration: Iteration = None,
    iterations: Iterations = None,
    task_overhead: Annotated[Optional[float], typer.Option(
        "--task-overhead", help="Seconds of dispatch cost per task in every replay (default: calibrated from "
        "this trace).")] = None,
    json_mode: JsonFlag = False,
) -> None:
    """Replay the trace's realized durations under its own hint and every built-in, fixed and ready."""
    from hints.errors import UserError
    from profiler.analysis.replay import sensitivity
    from profiler.analysis.windows import traced_iterations

    if task_overhead is not None and not task_overhead >= 0:
        raise UserError(f"must be a number >= 0, got {task_overhead}", "--task-overhead")
    def answer(frames):
        # Chosen iterations must all replay; by default the complete ones with every rank's hint do.
        chosen = None if iteration is None and iterations is None else traced_iterations(frames)
        result = sensitivity(frames, chosen, task_overhead)
        data = result.to_json()
        return data, lambda console: _render_sensitivity(console, result, data)

    _answer(run, Output(json_mode), answer, iteration, iterations)


def _render_sensitivity(console: Console, result, data: dict) -> None:
    from runtime.sched.evaluate import versus_label

    own = result.rows[0].makespan
    columns = [Column("hint", text=True, key=True), Column("rule", text=True, key=True), Column("simulated"),
               Column("vs traced"), Column(versus_label(result.baseline)), Column("/bound")]
    rows = [[row.hint, row.label + ("" if row.within_budget else " (over budget)"), f"{row.makespan * 1e3:.2f}",
             f"{own / row.makespan:.3f}x", f"{row.speedup:.3f}x", f"{row.over_bound:.3f}"] for row in result.rows]
    print_table(console, columns, rows, title=f"hint sensitivity at the traced budget ({result.budget}): "
                f"realized durations of iteration(s) {_ranges(result.iterations)} replayed (simulated: median "
                f"makespan in ms)")
    errors = list(result.errors.values())
    source = (f"calibrated from {result.overhead.samples} dispatches" if result.overhead is not None
              else "given")
    console.print(f"measured {data['measured_makespan_s'] * 1e3:.2f} ms (median); the traced hint replayed "
                  f"with {result.overhead_s * 1e6:.0f} us dispatch overhead per task ({source}) is off by "
                  f"{min(errors):+.1%} .. {max(errors):+.1%} per iteration")
    sentence = result.credit.sentence(lambda seconds: f"{seconds * 1e3:.2f} ms")
    if sentence:
        console.print(f"[dim]{sentence} (1f1b-light/heavy: 1F1B with microbatches sorted by known cost; "
                      f"1f1b-light @budget: warm-ups that fill the budget; planned @budget: the order the arbiter "
                      f"runs on the known costs (the trace's per-stage means) within the budget, fixed.)[/]")


def _needs_decisions(frames, run: Path) -> None:
    """[Note: what a torch trace cannot say] in profiler.trace.torch_profile: no decisions to show."""
    from hints.errors import UserError

    if next(iter(frames.meta.values()), {}).get("source") == "torch-profiler":
        raise UserError("was imported from torch profiler traces: torch runs its schedule in fixed order, so "
                        "there are no arbiter decisions (see rrfp trace bubbles for what the order cost)", str(run))


@app.command("decisions")
def decisions_command(
    run: RunArg,
    rank: Annotated[Optional[int], typer.Option("--rank", min=0, help="Only this rank.")] = None,
    iteration: Iteration = None,
    iterations: Iterations = None,
    skipped: Annotated[bool, typer.Option("--skipped", help="Only decisions that passed over the hint head.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N rows.")] = 50,
    json_mode: JsonFlag = False,
) -> None:
    """The arbiter's decisions: ready set with hint positions, the choice, the hint head it skipped."""
    import polars as pl

    def answer(frames):
        _needs_decisions(frames, run)
        frame = frames.decisions
        if rank is not None:
            if rank >= frames.ranks:
                from hints.errors import UserError

                raise UserError(f"the trace has ranks 0..{frames.ranks - 1}, not {rank}", "--rank")
            frame = frame.filter(pl.col("rank") == rank)
        if skipped:
            frame = frame.filter(pl.col("skipped").is_not_null())
        total = frame.height
        frame = frame.head(limit)
        shown = frame.select(
            "rank", "iteration", "chosen", "hint_rank", "skipped",
            ((pl.col("time_ns") - pl.col("waited_from_ns")) / 1e6).alias("waited_ms"), "in_flight",
            pl.col("ready").str.split(" ").list.len().alias("ready_n"),
            pl.col("ready").str.split(" ").list.head(4).list.join(" ").alias("first_ready"),
            "held_back")
        return {"total": total, "decisions": frame.to_dicts()}, lambda console: _table(
            console, shown, f"{len(frame)} of {total} decisions (waited: ms since the rank began to wait; first "
            f"ready: up to 4 of the ready set, @ hint position)", keys=("rank", "iteration"))

    _answer(run, Output(json_mode), answer, iteration, iterations)


@app.command("follow")
def follow_command(
    run: RunArg,
    iteration: Iteration = None,
    iterations: Iterations = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N per-decision rows.")] = 20,
    json_mode: JsonFlag = False,
) -> None:
    """TP coordination: what each leader spent announcing, how long after it each follower followed."""
    import polars as pl

    from hints.errors import UserError
    from profiler.analysis.tp import follow_latency

    def answer(frames):
        _needs_decisions(frames, run)
        per_decision, per_rank = follow_latency(frames)
        if not per_rank.height:
            raise UserError("has no TP group decisions (run with --tp 2 or more)", str(run))
        total = per_decision.height
        shown = per_decision.head(limit)
        data = {"ranks": per_rank.to_dicts(), "total": total, "decisions": shown.to_dicts()}

        def render(console: Console) -> None:
            _table(console, per_rank.drop("dp_rank") if per_rank["dp_rank"].max() == 0 else per_rank,
                   "TP coordination per rank (us; announce share: of the median iteration makespan)",
                   formats={"announce_share": ".2%"})
            table = shown.select("rank", "iteration", "index", "chosen",
                                 *[(pl.col(f"{c}_ns") / 1e3).alias(f"{c}_us")
                                   for c in ("follow", "delivery", "after_arrival")])
            _table(console, table, f"{len(shown)} of {total} followed decisions (us after the leader decided: "
                   f"started, decision arrived; after arrival: until started)", keys=("rank", "iteration"))

        return data, render

    _answer(run, Output(json_mode), answer, iteration, iterations)


@app.command("compare")
def compare_command(
    a: Annotated[Path, typer.Argument(help="Run directory or trace (the baseline).", metavar="A")],
    b: Annotated[Path, typer.Argument(help="Run directory or trace.", metavar="B")],
    iterations: Iterations = None,
    json_mode: JsonFlag = False,
) -> None:
    """Two runs side by side: makespan, utilization, idle time per rank and iteration by category."""
    import polars as pl

    from profiler.analysis.summary import compare

    out = Output(json_mode)
    frame = compare(_load(a, out, iterations=iterations), _load(b, out, iterations=iterations))
    seconds = [c for c in frame.columns if c.endswith("_s")]
    shown = frame.drop("trace").with_columns([(pl.col(c) * 1e3).alias(c[:-2] + "_ms") for c in seconds]).drop(seconds)
    _emit(out, {"rows": frame.to_dicts()}, lambda console: _table(
        console, shown, f"A = {a}, B = {b} (median makespan in ms; idle columns: ms per rank and iteration)",
        {"utilization": ".1%", "speedup_vs_A": ".3f"}, ("run",)))


def _ranges(values: list[int]) -> str:
    from hints.tasks import ranges

    return ranges(values)


@app.command("timeline")
def timeline_command(
    run: RunArg,
    other: Annotated[Optional[Path], typer.Argument(
        help="A second run, drawn under the first on the same time axis.", metavar="[OTHER]")] = None,
    svg: Annotated[Optional[Path], typer.Option("--svg", help="Write the picture as SVG (for papers).")] = None,
    png: Annotated[Optional[Path], typer.Option("--png", help="Write the picture as PNG.")] = None,
    iteration: Iteration = None,
    iterations: Iterations = None,
    width: Annotated[int, typer.Option("--width", min=400, help="Width in pixels.")] = 1600,
    force: Force = False,
    json_mode: JsonFlag = False,
) -> None:
    """A picture of one iteration (default: the last): ranks as rows, tasks coloured by microbatch, idle time
    hatched by cause. An `rrfp run --compare` directory, or RUN and OTHER, are drawn as panels on one time axis."""
    from hints.errors import UserError
    from profiler.draw.timeline import save_timeline
    from profiler.trace.reader import job_runs

    if svg is None and png is None:
        raise UserError("give --svg FILE and/or --png FILE: where to write the picture", "timeline")
    for path, flag, suffix, kind in ((svg, "--svg", ".svg", "SVG"), (png, "--png", ".png", "PNG")):
        if path is not None:  # before reading the trace: a bad destination fails fast
            check_new_file(path, force, flag, (suffix,), kind)
    out = Output(json_mode)
    loaded = []
    for given in (run, other):
        if given is not None:
            for job in job_runs(given) or [given]:
                frames = _load(job, out, iteration, iterations)
                loaded.append((str(next(iter(frames.meta.values())).get("job") or job.name), job, frames))
    names = [name for name, _, _ in loaded]  # a panel is its job's name, or its path when two jobs share one
    runs = [(name if names.count(name) == 1 else str(path), frames) for name, path, frames in loaded]
    written = save_timeline(runs, svg, png, None, width)
    _emit(out, {"written": [str(p) for p in written], "panels": [title for title, _ in runs],
                **({"svg": str(svg)} if svg is not None else {}), **({"png": str(png)} if png is not None else {})},
          lambda console: console.print(f"wrote {', '.join(str(p) for p in written)} "
                                        f"({len(runs)} panel{'s' if len(runs) > 1 else ''})"))
