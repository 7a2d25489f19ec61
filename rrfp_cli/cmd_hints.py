"""``rrfp hints``: list, show, check and export hint orders.

``export --torch-csv`` writes only a CSV torch can run ([Note: a CSV torch can run] in
:mod:`hints.files.torch_csv`: the fixed-order check of ``check``, then torch's own lowering), and refuses an
order that depends on each iteration's costs unless ``--freeze-iteration N`` binds one iteration's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from hints.errors import UserError
from hints.files.hint_json import hint_to_json
from hints.files.torch_csv import check_runs_in_torch, check_torch_lowering, in_torch_loss_order, torch_csv_text
from hints.files.torch_names import TORCH_SCHEDULES
from hints.orders import BUILTIN_HINTS, HintOrder
from hints.outputs import Outputs
from rrfp_cli.helpscreen import App
from rrfp_cli.options import Chunks, JsonFlag, Microbatches, Placement, Ranks, SplitOverhead, Workload, placement_value
from rrfp_cli.output import Column, Output, check_new_file, print_table
from runtime.sched.baselines import PLANNED

app = App(help="Hint orders: list the built-ins, draw one, check a file, export to torch.",
          no_args_is_help=True)

HintArg = Annotated[str, typer.Argument(help="Built-in name, hint file, or torch:SCHEDULE.", metavar="NAME|FILE")]

MICROBATCH_COLOURS = (
    "bright_blue", "bright_green", "bright_magenta", "bright_cyan", "yellow", "bright_red",
    "blue", "green", "magenta", "cyan", "orange3", "red",
)
KIND_STYLE = {"F": "", "B": "reverse ", "I": "reverse ", "W": "underline "}


def resolve_hint(spec: str, stages, chunks, microbatches, placement=None, workload=None,
                 split_overhead=None) -> HintOrder:
    """A hint as the other commands build it; ``cp`` from the expected durations of ``workload`` (default
    uniform), which decide its priorities and which stages it splits."""
    from runtime.sched.evaluate import resolve

    model = None
    if workload is not None or split_overhead is not None:
        from runtime.durations.variability import VariabilityModel

        model = VariabilityModel(workload=workload.value if workload is not None else "uniform",
                                 split_overhead=split_overhead)
    return resolve(spec, stages, chunks, microbatches, placement=placement_value(placement), model=model)


@app.command("list")
def list_hints(json_mode: JsonFlag = False) -> None:
    """List the built-in hints and the torch schedules that can be imported."""
    rows = [
        {"name": h.name, "chunks": h.chunks, "split_backward": h.split_backward, "placements": list(h.placements),
         "summary": h.summary}
        for h in BUILTIN_HINTS.values()
    ]
    torch_rows = [f"torch:{name}" for name in TORCH_SCHEDULES]

    def render(console: Console) -> None:
        print_table(console, [Column("name", text=True, key=True), Column("chunks", text=True),
                              Column("backward", text=True), Column("placement", text=True),
                              Column("order", text=True)],
                    [[row["name"], row["chunks"], "I + W" if row["split_backward"] else "B",
                      ", ".join(row["placements"]), row["summary"]] for row in rows], title="Built-in hints")
        console.print("Also: " + ", ".join(torch_rows) + " (imported from torch.distributed.pipelining); "
                      f"{PLANNED} ({PLANNED_SUMMARY}); or a hint file (rrfp-hint/1 JSON, torch CSV).")

    Output(json_mode).result({"builtins": rows, "torch": torch_rows,
                              "planned": {"name": PLANNED, "summary": PLANNED_SUMMARY}}, render)


PLANNED_SUMMARY = ("the order the arbiter runs on the known costs within --memory-budget, from cp or zb lightest "
                   "first, fixed as it ran: a zero-bubble order planned before each iteration (needs workload "
                   "costs; docs/simulator.md)")


@app.command("show")
def show(
    hint: HintArg,
    stages: Ranks = None,
    microbatches: Microbatches = None,
    chunks: Chunks = None,
    placement: Placement = None,
    workload: Workload = None,
    split_overhead: SplitOverhead = None,
    json_mode: JsonFlag = False,
) -> None:
    """Draw a hint as a coloured grid, one row per rank (colour = microbatch). cp, bfw and the sorted
    1F1Bs are built from the workload's expected durations (--workload, microbatches sampled at seed 0;
    default uniform), which also decide the stages cp splits."""
    order = resolve_hint(hint, stages, chunks, microbatches, placement, workload, split_overhead)
    Output(json_mode).result(hint_to_json(order), lambda console: render_grid(console, order))


@app.command("check")
def check(
    hint: HintArg,
    stages: Ranks = None,
    microbatches: Microbatches = None,
    chunks: Chunks = None,
    placement: Placement = None,
    json_mode: JsonFlag = False,
) -> None:
    """Validate a hint and check that it completes when run in exactly its order."""
    from runtime.sched.simulator import check_completes

    order = resolve_hint(hint, stages, chunks, microbatches, placement)
    check_completes(order)
    shape = order.shape
    Output(json_mode).result(
        {"hint": order.name, "shape": shape.to_json(), "valid": True, "completes": True},
        lambda console: console.print(f"[green]ok[/]: {order.name} ({shape.describe()}) is valid "
                                      f"and completes under the fixed policy"),
    )


@app.command("export")
def export(
    hint: HintArg,
    stages: Ranks = None,
    microbatches: Microbatches = None,
    chunks: Chunks = None,
    placement: Placement = None,
    torch_csv: Annotated[Optional[Path], typer.Option("--torch-csv", help="Write torch's per-rank CSV "
                                                      "(_PipelineScheduleRuntime._load_csv, compute_only), "
                                                      "only if torch can run it: it completes in exactly its "
                                                      "order and torch's lowering accepts it.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write an rrfp-hint/1 JSON file.")] = None,
    workload: Workload = None,
    split_overhead: SplitOverhead = None,
    freeze_iteration: Annotated[Optional[int], typer.Option(
        "--freeze-iteration", min=0, metavar="N", help="Bind an order that depends on each iteration's costs "
        "(bfw, cp, 1f1b-light/-heavy, a cost-ranked rrfp-hint/2 file) to iteration N's: the --workload "
        "model's microbatches drawn at seed N. Needed for --torch-csv: torch runs one order every step.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite output files that exist.")] = False,
    json_mode: JsonFlag = False,
) -> None:
    """Write a hint as rrfp-hint/1 JSON (--out) and/or torch CSV (--torch-csv): both or neither."""
    if torch_csv is None and out is None:
        raise typer.BadParameter("give --out FILE.json and/or --torch-csv FILE.csv", param_hint="--out")
    for path, flag, suffix, kind in ((out, "--out", ".json", "rrfp-hint JSON"), (torch_csv, "--torch-csv", ".csv",
                                                                                  "torch's CSV")):
        if path is not None:  # before any work: a bad destination fails fast
            check_new_file(path, force, flag, (suffix,), kind)
    output = Output(json_mode)
    order = resolve_hint(hint, stages, chunks, microbatches, placement, workload, split_overhead)
    why = _cost_dependence(hint, order)
    frozen = None
    if why and freeze_iteration is not None:
        order, frozen = _freeze(hint, order, freeze_iteration, workload, split_overhead)
    elif why and torch_csv is not None:
        raise UserError(f"{order.name} {why}, but torch runs one CSV in the same order every step: pass "
                        "--freeze-iteration N to bind iteration N's costs (those of the --workload model's "
                        "microbatches drawn at seed N)", "--torch-csv")
    elif freeze_iteration is not None:
        output.note(f"--freeze-iteration: {order.name} does not depend on costs; there is nothing to bind")
    torch_text = torch_version = renamed = None
    if torch_csv is not None:  # [Note: a CSV torch can run]: every check before anything is written
        from runtime.sched.simulator import check_completes

        order, renamed = in_torch_loss_order(order)  # both files hold the order torch runs
        check_runs_in_torch(order, check_completes)
        torch_text = torch_csv_text(order)
        torch_version = check_torch_lowering(order, torch_text)
    with Outputs() as outputs:  # both or neither ([Note: outputs written whole] in hints.outputs)
        if torch_text is not None:
            outputs.write_text(torch_csv, torch_text)
        if out is not None:
            outputs.write_text(out, json.dumps(hint_to_json(order), indent=1) + "\n")
    written = [str(path) for path in (torch_csv, out) if path is not None]
    if frozen is not None:
        output.warn(f"{'the CSV binds' if torch_csv is not None else 'the hint binds'} iteration "
                    f"{freeze_iteration}'s costs ({frozen}); torch runs this one order every step, whatever "
                    "each step's microbatches cost")
    if renamed is not None:
        which = f"iteration {freeze_iteration}'s microbatch" if frozen is not None else "the hint's microbatch"
        files = "the CSV and the JSON rename" if out is not None else "the CSV renames"
        output.warn(f"torch looks the last stage's losses up by the order its forwards run, so they must run as "
                    f"microbatches 0, 1, 2, ...: {files} the microbatches (the same order), microbatch k being "
                    f"{which} {renamed}[k]; feed torch the microbatches in that order")
    data = {"hint": order.name, "written": written, "frozen_iteration": freeze_iteration if frozen else None,
            "renamed_microbatches": renamed, "warnings": output.warnings}
    if torch_csv is not None:
        data["torch_checks"] = {"completes_in_fixed_order": True, "torch_lowering": torch_version}
    output.result(
        data, lambda console: console.print(f"wrote {', '.join(written)} ({order.name}, {order.shape.describe()})"),
    )


def _cost_dependence(spec: str, order: HintOrder) -> str:
    """Why ``order`` changes with each iteration's per-microbatch costs ("" if it does not)."""
    if order.cost_ranked:
        return "is cost-ranked (rrfp-hint/2): each iteration re-ranks its microbatches by their costs"
    builtin = BUILTIN_HINTS.get(spec)
    if builtin is not None and builtin.takes_priorities:
        return "is built from each iteration's expected durations (its priorities and split stages)"
    if builtin is not None and builtin.takes_costs:
        return "orders microbatches by each iteration's expected costs"
    return ""


def _freeze(spec: str, order: HintOrder, iteration: int, workload, split_overhead) -> tuple[HintOrder, str]:
    """``order`` bound to iteration ``iteration``'s costs: the workload model's microbatches drawn at that seed
    (what ``rrfp simulate --seed N`` draws). Returns the bound index order and where its costs came from."""
    from runtime.durations.variability import VariabilityModel, sample_durations
    from runtime.sched.evaluate import concrete, resolve

    model = VariabilityModel(workload=workload.value if workload is not None else "uniform",
                             split_overhead=split_overhead)
    shape = order.shape
    if order.cost_ranked:
        table = sample_durations(model, shape, iteration)
        bound = concrete(order, table)
    else:
        table = sample_durations(model, shape.with_split(False), iteration)
        bound = resolve(spec, shape.ranks, shape.chunks, shape.microbatches, table, shape.placement)
    source = f"the {model.workload} model's microbatches drawn at seed {iteration}"
    return replace(bound, provenance={**bound.provenance, "frozen_iteration": iteration, "costs": source}), source


def render_grid(console: Console, hint: HintOrder) -> None:
    """Rank rows, step columns; split into blocks of steps that fit the terminal."""
    rows = hint.text_orders()
    cell = max(len(text) for row in rows for text in row) + 1
    label = len(f"rank {len(rows) - 1}") + 3
    per_block = max(4, (console.width - label) // cell)
    longest = max(len(row) for row in rows)
    console.print(f"[bold]{hint.name}[/]: {hint.shape.describe()}")
    for first in range(0, longest, per_block):
        if longest > per_block:
            console.print(f"[dim]steps {first}..{min(longest, first + per_block) - 1}[/]")
        for rank, row in enumerate(rows):
            line = Text(f"{'rank ' + str(rank):<{label - 3}} | ", style="bold")
            for task in hint.orders[rank][first:first + per_block]:
                colour = MICROBATCH_COLOURS[task.microbatch % len(MICROBATCH_COLOURS)]
                line.append(f"{str(task):<{cell - 1}}", style=KIND_STYLE[task.kind.value] + colour)
                line.append(" ")
            console.print(line, no_wrap=True, overflow="crop")
    console.print("[dim]colour = microbatch; F plain, B/I reversed, W underlined[/]")
