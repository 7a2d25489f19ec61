"""``rrfp simulate``: replay the arbiter on modelled or recorded durations."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from hints.errors import UserError
from hints.hintfile import TORCH_PREFIX, resolve_hint
from hints.orders import BUILTIN_HINTS, applicable_builtins, baseline_hint_name
from rrfp_cli.options import (
    BackwardRatio,
    Chunks,
    CommJitter,
    CommLatency,
    DurationsFile,
    ForwardTime,
    Jitter,
    JsonFlag,
    MemoryBudgetOpt,
    Microbatches,
    PolicyChoice,
    PolicyOpt,
    Seed,
    Stages,
    StragglerProb,
    StragglerSlowdown,
    Workload,
    WorkloadChoice,
    variability_model,
)
from rrfp_cli.output import Output, format_seconds


def simulate(
    stages: Stages = None,
    chunks: Chunks = None,
    microbatches: Microbatches = None,
    hint: Annotated[
        Optional[str],
        typer.Option("--hint", help="Built-in name, hint file, or torch:SCHEDULE. "
                     "Default: 1f1b (interleaved-1f1b with --chunks >= 2)."),
    ] = None,
    policy: PolicyOpt = PolicyChoice.ready,
    memory_budget: MemoryBudgetOpt = "1f1b",
    workload: Workload = WorkloadChoice.uniform,
    forward_time: ForwardTime = 0.010,
    backward_ratio: BackwardRatio = 2.0,
    jitter: Jitter = 0.0,
    straggler_prob: StragglerProb = 0.0,
    straggler_slowdown: StragglerSlowdown = 4.0,
    comm_latency: CommLatency = 0.0,
    comm_jitter: CommJitter = 0.0,
    durations: DurationsFile = None,
    durations_iteration: Annotated[Optional[int], typer.Option(
        "--durations-iteration", min=0, help="Which iteration of a --durations table with an iteration column "
        "(default: the first).", rich_help_panel="Variability model")] = None,
    seed: Seed = 0,
    compare: Annotated[bool, typer.Option("--compare", help="Run every built-in hint under both policies "
                                          "on the same durations; speedups against fixed-order 1F1B.")] = False,
    json_mode: JsonFlag = False,
) -> None:
    """Simulate one hint and policy, or --compare all built-ins, on sampled or recorded durations."""
    from runtime.arbiter import MemoryBudget, Policy
    from runtime.deps import TaskGraph
    from runtime.simulator import simulate as run_simulation
    from runtime.variability import load_durations, sample_durations

    out = Output(json_mode)
    budget = MemoryBudget.parse(memory_budget)
    hint_spec = hint or baseline_hint_name(chunks or 1)
    file_hint = None
    if hint_spec not in BUILTIN_HINTS and not hint_spec.startswith(TORCH_PREFIX):
        file_hint = resolve_hint(hint_spec, stages, chunks, microbatches)
        stages, chunks, microbatches = (file_hint.shape.ranks, file_hint.shape.chunks,
                                        file_hint.shape.microbatches)
    chunks = chunks or 1
    if stages is None or microbatches is None:
        raise UserError("give --stages and --microbatches (or a hint file that fixes them)", "rrfp simulate")

    from hints.tasks import PipelineShape

    shape = PipelineShape(stages, chunks, microbatches)
    model = variability_model(workload, forward_time, backward_ratio, jitter, straggler_prob,
                              straggler_slowdown, comm_latency, comm_jitter)
    if durations is not None:
        table = load_durations(durations, shape.stages, microbatches, comm_latency, durations_iteration)
        source = {"durations": str(durations), "iteration": durations_iteration, "comm_latency": comm_latency}
    else:
        table = sample_durations(model, shape, seed)
        source = {"workload": workload.value, "seed": seed, "model": model.__dict__}

    if not compare:
        order = file_hint or resolve_hint(hint_spec, stages, chunks, microbatches, table.microbatch_costs)
        began = time.perf_counter()
        result = run_simulation(order, table, Policy(policy.value), budget)
        elapsed = time.perf_counter() - began
        data = {**result.to_json(), "memory_budget_spec": str(budget), "source": source,
                "wall_seconds": elapsed}
        out.result(data, lambda console: _render_one(console, result, budget, elapsed))
        return

    hints = applicable_builtins(stages, chunks, microbatches, table.microbatch_costs)
    if file_hint is not None or hint_spec.startswith(TORCH_PREFIX):
        extra = file_hint or resolve_hint(hint_spec, stages, chunks, microbatches)
        hints[extra.name] = extra
    baseline = baseline_hint_name(chunks)
    graphs: dict[bool, TaskGraph] = {}
    rows = []
    with out.progress("simulating", total=2 * len(hints)) as advance:
        for name, order in hints.items():
            if order.shape.split_backward not in graphs:  # one compiled graph per shape, not per hint
                graphs[order.shape.split_backward] = TaskGraph.build(order.shape)
            graph = graphs[order.shape.split_backward]
            for pol in (Policy.FIXED, Policy.READY):
                result = run_simulation(order, table, pol, budget, graph=graph)
                rows.append({"hint": name, "policy": str(pol), "makespan": result.makespan,
                             "bubble_fraction": result.bubble_fraction,
                             "peak_in_flight": max(result.peak_in_flight)})
                advance(1)
    base = next(r["makespan"] for r in rows if r["hint"] == baseline and r["policy"] == "fixed")
    for row in rows:
        row["speedup"] = base / row["makespan"] if row["makespan"] > 0 else float("nan")
    data = {"shape": shape.to_json(), "baseline": f"{baseline} fixed", "memory_budget": str(budget),
            "memory_budget_slots": budget.per_rank(shape), "source": source, "rows": rows}
    out.result(data, lambda console: _render_compare(console, data, shape))


def _render_one(console: Console, result, budget, elapsed: float) -> None:
    shape = result.graph.shape
    summary = Table(title=f"{result.hint} under {result.policy} ({shape.describe()})", title_justify="left",
                    show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("makespan", format_seconds(result.makespan))
    summary.add_row("bubble fraction", f"{result.bubble_fraction:.1%}")
    summary.add_row("memory budget", "not applied (fixed order)" if result.budgets is None
                    else f"{budget} = {_compact(result.budgets)} slots per rank")
    summary.add_row("tasks simulated", f"{len(result.graph):,} in {elapsed:.2f} s")
    console.print(summary)
    ranks = Table(title="per rank", title_justify="left")
    for column in ("rank", "busy", "idle", "idle %", "peak in flight"):
        ranks.add_column(column, justify="right")
    for rank, (busy, idle) in enumerate(zip(result.busy, result.idle)):
        ranks.add_row(str(rank), format_seconds(busy), format_seconds(idle),
                      f"{idle / result.makespan:.1%}" if result.makespan else "-",
                      str(result.peak_in_flight[rank]))
    console.print(ranks)


def _render_compare(console: Console, data: dict, shape) -> None:
    rows = data["rows"]
    best = min(r["makespan"] for r in rows)
    table = Table(
        title=f"{shape.describe()}; memory budget {data['memory_budget']} for ready; "
              f"speedup vs {data['baseline']}",
        title_justify="left",
    )
    for column, justify in (("hint", "left"), ("policy", "left"), ("makespan", "right"),
                            ("bubble", "right"), ("peak in flight", "right"), ("speedup", "right")):
        table.add_column(column, justify=justify)
    for row in rows:
        style = "bold green" if row["makespan"] == best else None
        table.add_row(row["hint"], row["policy"], format_seconds(row["makespan"]),
                      f"{row['bubble_fraction']:.1%}", str(row["peak_in_flight"]), f"{row['speedup']:.3f}x",
                      style=style)
    console.print(table)


def _compact(values: list[int]) -> str:
    if len(set(values)) == 1:
        return str(values[0])
    if len(values) <= 8:
        return ",".join(map(str, values))
    return f"{min(values)}..{max(values)}"
