"""``rrfp trace export|merge|import``: traces in and out of rrfp's format (Parquet frames, duration tables,
Chrome JSON; per-rank files merged; torch profiler traces imported). The commands are registered on
``rrfp trace``'s app (:mod:`rrfp_cli.cmd_trace`), whose loading, window and output helpers they share.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from rrfp_cli.cmd_trace import Force, JsonFlag, RunArg, _emit, _iteration_window, _load, _ranges, app
from rrfp_cli.options import Chunks, Microbatches, Ranks
from rrfp_cli.output import (
    Output,
    check_new_directory,
    check_new_file,
    check_writable,
    print_pairs,
    shell_lines,
)


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
        "default every complete one but iteration 0, which pays for start-up, unless it is the only one).")] = None,
    chrome: Annotated[Optional[Path], typer.Option(
        "--chrome", help="Write Chrome trace JSON (torch.profiler's format): a directory gets one "
        "rank<r>_trace.json per rank (what HTA reads); a FILE.json or FILE.json.gz one trace of every rank "
        "(chrome://tracing, Perfetto UI).")] = None,
    force: Force = False,
    json_mode: JsonFlag = False,
) -> None:
    """Write the trace's frames as Parquet (--parquet), its realized durations as a table (--durations), Chrome
    trace JSON (--chrome), or several."""
    from hints.errors import UserError
    from hints.outputs import Outputs
    from profiler.trace.chrome import check_chrome_destination, rank_file, write_chrome
    from profiler.trace.reader import FRAME_NAMES

    if parquet is None and durations is None and chrome is None:
        raise UserError("give --parquet DIR, --durations FILE, or both, and/or --chrome PATH", "rrfp trace export")
    if iterations is not None and durations is None:
        raise UserError("applies to --durations only", "--iterations")
    window = None if iterations is None else _iteration_window(iterations)
    files = [f"{name}.parquet" for name in FRAME_NAMES] + ["meta.json"]
    if durations is not None:  # before reading the trace: a bad path fails fast
        from runtime.durations.tables import check_destination

        check_new_file(durations, force, "--durations")
        check_destination(durations)
    if parquet is not None:
        check_new_directory(parquet, files, force, "--parquet")
    if chrome is not None:
        check_chrome_destination(chrome, force, "--chrome")
        _check_chrome_name(chrome)
        check_writable(chrome / rank_file(0) if chrome.is_dir() else chrome, f"--chrome {chrome}")
    _distinct([(flag, path) for flag, path in (("--durations", durations), ("--parquet", parquet),
                                               ("--chrome", chrome)) if path is not None])
    out = Output(json_mode)
    frames = _load(run, out, select=False)  # the frames are exported whole
    data: dict = {"written": []}
    with Outputs() as outputs:  # all or none ([Note: outputs written whole] in hints.outputs)
        if durations is not None:
            from profiler.analysis.windows import cut_short_notes

            for note in cut_short_notes(frames, window):  # [Note: iterations cut short]
                out.warn(note)
            data["durations"] = _export_durations(frames, durations, window, outputs)
            data["written"].append(str(durations))
        if parquet is not None:
            data["written"] += _export_parquet(frames, parquet, outputs)
        if chrome is not None:
            data["written"] += write_chrome(frames, chrome, force, "--chrome", outputs)

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
            console.print("replay one:\n" + shell_lines(table["replay"], console.width), markup=False,
                          soft_wrap=True)  # one command to copy

    _emit(out, data, render)


def _check_chrome_name(path: Path) -> None:
    """A --chrome name that is not .json or .json.gz would become a directory of per-rank files: refuse one that
    says it is a file of another format (``trace.gz``, ``t.csv``) rather than make a directory of that name."""
    from hints.errors import UserError

    if path.is_dir() or not path.suffix:
        return
    if path.suffix.lower() in (".gz", ".csv", ".parquet", ".pq", ".png", ".svg", ".pftrace", ".html", ".txt", ".md"):
        raise UserError("writes Chrome trace JSON: give a name ending in .json or .json.gz (one file) or a directory "
                        "(one file per rank)", f"--chrome {path}")


def _distinct(destinations: list[tuple[str, Path]]) -> None:
    """Two outputs of one export may not be one path (the second would replace the first)."""
    from hints.errors import UserError

    seen: dict[Path, str] = {}
    for flag, path in destinations:
        key = path.resolve()
        if key in seen:
            raise UserError(f"is also given to {seen[key]}; give each output its own path", f"{flag} {path}")
        seen[key] = flag


def _export_parquet(frames, directory: Path, outputs) -> list[str]:
    """Every frame as ``<name>.parquet`` and the metadata as ``meta.json``, staged among ``outputs``."""
    folder = outputs.directory(directory)
    written = [outputs.write(folder / f"{name}.parquet", frame.write_parquet)
               for name, frame in frames.frames().items()]
    written.append(outputs.write_text(folder / "meta.json", json.dumps(frames.meta, indent=1)))
    return [str(path) for path in written]


def _export_durations(frames, path: Path, window: tuple[int, int | None] | None, outputs) -> dict:
    import shlex

    from hints.errors import UserError
    from profiler.analysis.realized import realized_iterations
    from profiler.analysis.windows import chosen_iterations, pipeline_shape
    from runtime.durations.tables import write_durations

    complete = realized_iterations(frames)  # every complete iteration; the window picks among them
    chosen = chosen_iterations([r.iteration for r in complete], window)
    realized = [r for r in complete if r.iteration in chosen]
    if not realized:
        start, stop = window
        raise UserError(f"no complete iteration in {start}:{'' if stop is None else stop} "
                        f"(complete: {_ranges([r.iteration for r in complete])})", "--iterations")
    rows = write_durations(path, [(r.iteration, r.durations) for r in realized], outputs=outputs)
    shape = pipeline_shape(frames)
    meta = next(iter(frames.meta.values()))
    replay = ["rrfp", "simulate", "--durations", str(path), "--durations-iteration", str(realized[0].iteration),
              "--ranks", str(shape.ranks), "--chunks", str(shape.chunks), "--microbatches", str(shape.microbatches),
              "--placement", shape.placement, "--hint", str(meta.get("hint")), "--policy", str(meta.get("policy"))]
    if meta.get("policy") == "ready":
        replay += ["--memory-budget", str(meta.get("memory_budget"))]
        # Traces older than the lookahead rule (no "rule") ran greedy readiness.
        replay += ["--lookahead", "on" if meta.get("rule") == "lookahead" else "off"]
    if meta.get("p2p") == "blocking":
        replay += ["--p2p", "blocking"]
    return {"file": str(path), "iterations": [r.iteration for r in realized], "task_rows": rows,
            "latencies_measured": sum(len(r.measured) for r in realized),
            "latencies_filled": sum(len(r.filled) for r in realized),
            "replay": shlex.join(replay)}


@app.command("merge")
def merge_command(
    run: Annotated[Path, typer.Argument(help="Run directory with trace/rank*.pftrace.", metavar="RUN")],
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Default RUN/trace.pftrace.")] = None,
    force: Force = False,
    json_mode: JsonFlag = False,
) -> None:
    """Merge per-rank traces into one, packet by packet (rrfp run does this itself unless it crashed)."""
    from hints.errors import UserError
    from profiler.trace.recorder import merge_traces
    from profiler.trace.schema import rank_trace_files

    files = rank_trace_files(run)
    if not files:
        raise UserError("has no trace/rank*.pftrace files to merge", str(run))
    target = out_file or run / "trace.pftrace"
    check_new_file(target, force, "--out", (".pftrace",), "a Perfetto trace")
    out = Output(json_mode)
    merged = merge_traces(files, target)
    for warning in merged.warnings:
        out.warn(warning)
    _emit(out, {"merged": [str(f) for f in files], "out": str(merged.out), "packets": merged.packets},
          lambda console: console.print(f"merged {len(files)} rank traces ({merged.packets} packets) into "
                                        f"{merged.out}"))


@app.command("import")
def import_command(
    traces: Annotated[list[Path], typer.Argument(
        help="torch profiler traces (Chrome JSON, .json or .json.gz), one per rank, or folders of them "
             "(torchtitan's profile folder).", metavar="TRACE...")],
    out_dir: Annotated[Path, typer.Option("--out", help="New run directory to write.")],
    schedule: Annotated[Optional[str], typer.Option(
        "--schedule", help="torch's schedule the job ran (1F1B, GPipe, Interleaved1F1B, InterleavedZeroBubble, "
        "ZBVZeroBubble, DualPipeV); checked against the trace. Default: inferred.")] = None,
    stages: Ranks = None,
    chunks: Chunks = None,
    microbatches: Microbatches = None,
    json_mode: JsonFlag = False,
) -> None:
    """Import torch profiler traces of a torch.distributed.pipelining job as a run that every `rrfp trace` command and `rrfp tune-hint RUN` read.

    The shape is read off the traces; -p/-v/-m, when given, are checked against it. What a torch trace cannot say
    (arbiter decisions, counters, message sizes) is marked: docs/traces.md."""
    from profiler.trace.torch_profile import import_torch_traces

    out = Output(json_mode)
    with out.progress("reading traces", len(traces)) as advance:
        imported = import_torch_traces(traces, out_dir, schedule, stages, chunks, microbatches,
                                       progress=lambda _: advance(1))
    for warning in imported.warnings:
        out.warn(warning)
    data = imported.to_json()

    def render(console: Console) -> None:
        print_pairs(console, [
            ("run", str(imported.out)), ("shape", imported.shape.describe()),
            ("schedule", imported.schedule), ("steps", ", ".join(map(str, imported.iterations))),
            ("complete", ", ".join(map(str, imported.complete)) or "none"),
            ("tasks", str(imported.tasks)), ("messages", str(imported.transfers)),
            ("memory", f"{imported.memory_budget} (peak in flight per rank: "
                       f"{', '.join(map(str, imported.peaks))})"),
            ("timing", imported.timing),
            ("not in the trace", "arbiter decisions, ready sets, counters, message sizes"),
        ], title="imported torch profiler traces")
        console.print(f"next: rrfp trace bubbles {imported.out}; rrfp trace sensitivity {imported.out}; "
                      f"rrfp tune-hint {imported.out} --policy fixed")

    _emit(out, data, render)
