"""``rrfp simulate``: replay the arbiter on modelled or recorded durations."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.console import Console

from hints.errors import UserError
from hints.files.load import hint_or_baseline, hint_shape, resolve_hint
from hints.files.torch_names import TORCH_PREFIX
from hints.orders import BUILTIN_HINTS
from rrfp_cli.options import (
    MODEL_KNOBS,
    BackwardRatio,
    Chunks,
    CommJitter,
    CommLatency,
    CostTableFile,
    DurationsFile,
    ForwardTime,
    Jitter,
    JsonFlag,
    LookaheadOpt,
    MemoryBudgetOpt,
    Microbatches,
    P2POpt,
    Placement,
    PolicyChoice,
    PolicyOpt,
    Ranks,
    Seed,
    SplitOverhead,
    StragglerProb,
    StragglerSlowdown,
    TaskOverhead,
    Unknown,
    Workload,
    WorkloadChoice,
    given_flags,
    lookahead_flag,
    p2p_value,
    placement_value,
    variability_model,
)
from rrfp_cli.output import Column, Output, format_seconds, print_pairs, print_table, time_unit


def simulate(
    ctx: typer.Context,
    stages: Ranks = None,
    chunks: Chunks = None,
    microbatches: Microbatches = None,
    placement: Placement = None,
    hint: Annotated[
        Optional[str],
        typer.Option("--hint", help="Built-in name, hint file, or torch:SCHEDULE. "
                     "Default: 1f1b (interleaved-1f1b with --chunks >= 2, zbv with --placement v)."),
    ] = None,
    policy: PolicyOpt = PolicyChoice.ready,
    lookahead: LookaheadOpt = None,
    p2p: P2POpt = None,
    memory_budget: MemoryBudgetOpt = "1f1b",
    workload: Workload = None,
    forward_time: ForwardTime = 0.010,
    backward_ratio: BackwardRatio = 2.0,
    jitter: Jitter = 0.0,
    straggler_prob: StragglerProb = 0.0,
    straggler_slowdown: StragglerSlowdown = 4.0,
    comm_latency: CommLatency = 0.0,
    comm_jitter: CommJitter = 0.0,
    split_overhead: SplitOverhead = None,
    unknown: Unknown = "",
    task_overhead: TaskOverhead = 0.0,
    durations: DurationsFile = None,
    cost_table: CostTableFile = None,
    describe: Annotated[bool, typer.Option(
        "--describe", help="Print what the workload's microbatches hold and how their cost varies (every preset, "
        "or the --workload given), measured on -m microbatches (default 1000) sampled at --seed; simulate "
        "nothing.", rich_help_panel="Variability model")] = False,
    durations_iteration: Annotated[Optional[int], typer.Option(
        "--durations-iteration", min=0, help="Which iteration of a --durations table with an iteration column "
        "(default: the first).", rich_help_panel="Variability model")] = None,
    seed: Seed = 0,
    iters: Annotated[Optional[int], typer.Option(
        "--iters", min=1, help="--policy auto: iterations to simulate; iteration i draws its table at --seed + i "
        "(or reads iteration --durations-iteration + i of a --durations table). Default 8.")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Run every built-in hint under fixed, ready and "
                                          "ready with lookahead on the same durations, at equal memory; "
                                          "speedups against fixed-order 1F1B. With --p2p blocking, every "
                                          "fixed order also with blocking p2p.")] = False,
    json_mode: JsonFlag = False,
) -> None:
    """Simulate one hint and policy, or --compare all built-ins, on sampled or recorded durations."""
    from runtime.sched.baselines import PLANNED
    from runtime.sched.bounds import bound_family, hint_bound, split_bound
    from runtime.sched.budget import MemoryBudget
    from runtime.sched.evaluate import builtin_candidates, concrete, durations_for, resolve
    from runtime.sched.rules import check_p2p, rule_for
    from runtime.sched.simulator import simulate as run_simulation

    out = Output(json_mode)
    if describe:
        _describe(out, workload, microbatches, seed, cost_table, durations)
        return
    budget = MemoryBudget.parse(memory_budget)
    asked = placement_value(placement)
    hint_spec = hint_or_baseline(hint, chunks, asked)
    file_hint = None
    if hint_spec not in BUILTIN_HINTS and hint_spec != PLANNED and not hint_spec.startswith(TORCH_PREFIX):
        file_hint = resolve_hint(hint_spec, stages, chunks, microbatches, placement=asked)
        stages, chunks, microbatches = (file_hint.shape.ranks, file_hint.shape.chunks,
                                        file_hint.shape.microbatches)
        asked = file_hint.shape.placement
    if stages is None or microbatches is None:
        raise UserError("give --ranks and --microbatches (or a hint file that fixes them)", "rrfp simulate")
    if compare and lookahead is not None:
        raise UserError("--compare runs ready with and without lookahead side by side; drop --lookahead",
                        "--lookahead")

    shape = hint_shape(hint_spec, stages, chunks, microbatches, asked)
    placed, chunks = shape.placement, shape.chunks
    if workload is not None and durations is not None:
        raise UserError("a recorded table has its own durations; give --workload or --durations", "--workload")
    if cost_table is not None and durations is not None:
        raise UserError("a recorded table has its own durations; give --cost-table or --durations", "--cost-table")
    # else silently ignored; --comm-latency applies to a table (it prices the messages of one without latencies)
    knobs = given_flags(ctx, set(MODEL_KNOBS) - {"comm_latency"}) if durations is not None else []
    if knobs:
        raise UserError(f"a recorded table has its own durations; give {knobs[0]} or --durations", knobs[0])
    if split_overhead is not None and durations is not None:
        raise UserError("prices the split of a --workload model; a recorded table keeps what it recorded",
                        "--split-overhead")
    if unknown and durations is not None:
        raise UserError("draws into a --workload model's durations; a recorded table keeps what it recorded",
                        "--unknown")
    workload = workload or WorkloadChoice.uniform
    model = variability_model(workload, forward_time, backward_ratio, jitter, straggler_prob,
                              straggler_slowdown, comm_latency, comm_jitter, cost_table, split_overhead, unknown)
    table = durations_for(shape, model, seed, durations, durations_iteration, comm_latency)
    if durations is not None:
        source = {"durations": str(durations), "iteration": durations_iteration, "comm_latency": comm_latency}
    else:
        source = {"workload": workload.value, "seed": seed,
                  "model": {**model.__dict__, "cost_table": str(cost_table) if cost_table is not None else None}}
    source["task_overhead"] = task_overhead

    p2p_mode = p2p_value(p2p) or "async"
    if policy.value == "auto" or iters is not None:
        if policy.value != "auto" or compare:
            raise UserError("simulates iterations under --policy auto (without --compare)", "--iters")
        if p2p_mode != "async":
            raise UserError("auto replays the fixed order with buffered links; drop --p2p", "--p2p")

        def tables():
            for i in range(iters or 8):
                drawn = table if i == 0 else durations_for(
                    shape, model, seed + i, durations, None if durations is None else (durations_iteration or 0) + i,
                    comm_latency)
                yield (concrete(file_hint, drawn) if file_hint
                       else resolve(hint_spec, stages, chunks, microbatches, drawn, placed, budget=budget)), drawn

        _simulate_auto(out, tables(), rule_for("auto", lookahead_flag(lookahead), hint_spec), budget, source,
                       iters or 8)
        return
    if not compare:
        rule = rule_for(policy.value, lookahead_flag(lookahead), hint_spec)
        check_p2p(p2p_mode, rule)
        order = (concrete(file_hint, table) if file_hint
                 else resolve(hint_spec, stages, chunks, microbatches, table, placed, budget=budget))
        began = time.perf_counter()
        result = run_simulation(order, table, rule, budget, overhead=task_overhead, p2p=p2p_mode)
        elapsed = time.perf_counter() - began
        # [Note: bound per hint family] in runtime.sched.bounds: the hint's own, and the universal one
        bound, universal = hint_bound(order.shape, table, result.graph), split_bound(shape, table)
        family = bound_family(order.shape)
        data = {**result.to_json(), "memory_budget_spec": str(budget), "source": source,
                "lower_bound": bound.value, "lower_bound_binding": bound.binding, "lower_bound_family": family,
                "makespan_over_bound": result.makespan / bound.value if bound.value > 0 else None,
                "universal_lower_bound": universal.value,
                "makespan_over_universal_bound": result.makespan / universal.value if universal.value > 0 else None,
                "wall_seconds": elapsed}
        out.result(data, lambda console: _render_one(console, result, budget, bound, family, universal, elapsed))
        return

    from runtime.sched.evaluate import DEFAULT_RULES
    from runtime.sched.evaluate import compare as run_compare

    hints = builtin_candidates(shape, table, budget)
    if file_hint is not None or hint_spec.startswith(TORCH_PREFIX):
        extra = file_hint or resolve(hint_spec, stages, chunks, microbatches, placement=placed)
        hints[extra.name] = extra
    blocking = p2p_mode == "blocking"
    with out.progress("simulating", total=(len(DEFAULT_RULES) + blocking) * len(hints)) as advance:
        comparison = run_compare(hints, table, budget, overhead=task_overhead, advance=advance, blocking=blocking)
    data = {**comparison.to_json(), "source": source}
    out.result(data, lambda console: _render_compare(console, comparison))


def _simulate_auto(out: Output, tables, ready, budget, source: dict, count: int) -> None:
    """``--policy auto`` over ``count`` iterations: one row per iteration, then auto against always-ready and
    always-fixed on the same tables ([Note: the auto policy] in runtime.sched.auto)."""
    from runtime.sched.auto import simulate_auto

    with out.progress("simulating", total=count) as advance:
        def counted():
            for item in tables:
                yield item
                advance(1)

        rows, policy = simulate_auto(counted(), ready, budget)
    totals = {"auto_s": sum(r.makespan for r in rows), "ready_s": sum(r.ready for r in rows),
              "fixed_s": sum(r.fixed for r in rows)}
    data = {"policy": "auto", "ready_rule": ready.name, "memory_budget_spec": str(budget), "source": source,
            "iterations": [r.to_json() for r in rows], "switches": policy.switches,
            "fixed_iterations": sum(1 for r in rows if r.decision.rule == "fixed"), **totals}

    def render(console: Console) -> None:
        print_table(console, [Column("iteration", key=True), Column("rule", text=True), Column("makespan"),
                              Column("ready"), Column("fixed"), Column("why", text=True)],
                    [[str(r.decision.iteration), r.decision.label, f"{r.makespan:.3f}", f"{r.ready:.3f}",
                      f"{r.fixed:.3f}", r.decision.reason] for r in rows],
                    title=f"--policy auto, {len(rows)} iterations, budget {budget}")
        console.print(f"total {totals['auto_s']:.3f} s: {totals['ready_s'] / totals['auto_s']:.3f}x always-ready "
                      f"({totals['ready_s']:.3f} s), {totals['fixed_s'] / totals['auto_s']:.3f}x always-fixed "
                      f"({totals['fixed_s']:.3f} s); {data['fixed_iterations']} iteration(s) fixed, "
                      f"{policy.switches} switch(es)")

    out.result(data, render)


DESCRIBE_MICROBATCHES = 1000


def _describe(out: Output, workload, microbatches, seed: int, cost_table, durations) -> None:
    """``--describe``: :func:`runtime.durations.variability.describe_workload` of one workload, or of every preset."""
    from runtime.durations.presets import CANONICAL_WORKLOADS
    from runtime.durations.variability import describe_workload

    if durations is not None:
        raise UserError("--describe describes a workload model, not a recorded table; drop --durations",
                        "--describe")
    if cost_table is not None and workload is None:
        raise UserError("a cost table is costed with a preset's cost model: give --workload PRESET", "--cost-table")
    count = microbatches or DESCRIBE_MICROBATCHES
    if count < 2:
        raise UserError(f"--describe needs at least 2 microbatches to measure a spread, got {count}",
                        "--microbatches")
    names = [workload.value] if workload is not None else CANONICAL_WORKLOADS
    rows = []
    for name in names:
        model = variability_model(WorkloadChoice(name), 0.010, 2.0, 0.0, 0.0, 4.0, 0.0, 0.0, cost_table)
        rows.append(describe_workload(model, count, seed))
    out.result({"describe": rows}, lambda console: _render_describe(console, rows, count, seed))


def _render_describe(console: Console, rows: list[dict], count: int, seed: int) -> None:
    def number(value, form: str) -> str:
        return "-" if value is None else format(value, form)

    table = [[row["workload"], str(row["samples"]), number(row["cost_cv"], ".2f"),
              number(row["heaviest_over_mean"], ".2f"), number(row["encoder_cv"], ".2f"),
              number(row["tokens_per_microbatch"], ",.0f"), number(row["text_only_share"], ".0%"),
              number(row["tiles_per_image"], ".1f"), number(row["frames_per_video"], ".1f"),
              number(row["mean_document"], ",.0f")] for row in rows]
    print_table(console, [Column("workload", text=True, key=True), Column("samples"), Column("cost CV"),
                          Column("max/mean"), Column("enc CV"), Column("tokens"), Column("text only"),
                          Column("tiles/img"), Column("frames"), Column("doc len")], table,
                title=f"{count} microbatches sampled at seed {seed}: cost of a language stage (CV, heaviest over "
                      f"mean), of an encoder stage (enc CV); tokens per microbatch; tiles per image; frames per "
                      f"video; mean document (piece) length")


def _render_one(console: Console, result, budget, bound, family: str, universal, elapsed: float) -> None:
    shape = result.graph.shape
    rule = result.rule
    title = (f"{result.hint} under {rule.policy}" + (" with lookahead" if rule.lookahead else "")
             + (" with blocking p2p" if result.p2p == "blocking" else ""))
    lower = (f"{format_seconds(bound.value)} ({family} graph, {bound.binding}); makespan is "
             f"{result.makespan / bound.value:.3f}x of it" if bound.value > 0 else "0")
    across = (f"{format_seconds(universal.value)} (free split, valid for every hint); makespan is "
              f"{result.makespan / universal.value:.3f}x of it" if universal.value > 0 else "0")
    print_pairs(console, [
        ("makespan", format_seconds(result.makespan)),
        ("lower bound", lower),
        ("universal bound", across),
        ("bubble fraction", f"{result.bubble_fraction:.1%}"),
        ("memory budget", "not applied (fixed order)" if result.budgets is None
         else f"{budget} = {_compact(result.budgets)} slots per rank"),
        ("tasks simulated", f"{len(result.graph):,} in {elapsed:.2f} s"),
    ], f"{title} ({shape.describe()})")
    unit, write = time_unit([*result.busy, *result.idle])
    rows = [[str(rank), write(busy), write(idle), f"{idle / result.makespan:.1%}" if result.makespan else "-",
             str(result.peak_in_flight[rank])] for rank, (busy, idle) in enumerate(zip(result.busy, result.idle))]
    print_table(console, [Column("rank", key=True), Column("busy"), Column("idle"), Column("idle %"),
                          Column("peak in flight")], rows, title=f"per rank (busy and idle in {unit})")


def _render_compare(console: Console, comparison) -> None:
    """[Note: equal memory] in runtime.sched.evaluate: rows within the budget together, the others apart."""
    shape, rows = comparison.shape, comparison.rows
    within = [r for r in rows if r.within_budget]
    over = [r for r in rows if not r.within_budget]
    fixed_over = {r.hint for r in over if r.rule == "fixed"}
    best = min(r.makespan for r in within)
    unit, write = time_unit([r.makespan for r in rows])
    versus_base = comparison.versus_label

    def cells(row, versus: bool) -> list[str]:
        shown = [row.hint, row.label, write(row.makespan), f"{row.speedup:.3f}x"]
        if versus:
            shown.append("-" if row.vs_fixed is None else
                         f"{row.vs_fixed:.3f}x" + ("*" if row.hint in fixed_over else ""))
        return shown + [f"{row.over_bound:.3f}", _memory(row, comparison.slots)]

    def columns(versus: bool) -> list[Column]:
        return [Column("hint", text=True, key=True), Column("rule", text=True, key=True), Column("makespan"),
                Column(versus_base), *([Column("vs fixed")] if versus else []), Column("/bound"), Column("memory")]

    print_table(console, columns(True), [cells(r, True) for r in within],
                title=f"{shape.describe()}: at equal memory (budget {comparison.budget} = "
                      f"{_compact(comparison.slots)} slots per rank); makespan in {unit}",
                row_styles=["bold green" if r.makespan == best else None for r in within])
    notes = [f"{versus_base}: speedup over {comparison.baseline}; vs fixed: over the same hint in fixed order "
             f"(what readiness itself adds); / bound: makespan over the lower bound of the hint's family "
             f"({_family_bounds(comparison.rows)}; the universal one, valid across families, is "
             f"{format_seconds(comparison.bound.value)}, {comparison.bound.binding}); memory: peak "
             f"microbatch-chunks in flight summed over ranks, over the budget's sum; ready+la: ready with "
             f"lookahead."]
    if comparison.credit.best_fixed is not None:
        notes.append(comparison.credit.sentence(format_seconds))
    if any(r.p2p == "blocking" for r in rows) or comparison.deadlocked:
        notes.append("fixed (blocking p2p): the same fixed order with Megatron's blocking send/receive, each rank "
                     "waiting after every task until its peers posted their receives (docs/simulator.md).")
    if comparison.deadlocked:
        notes.append(f"No blocking row for {', '.join(comparison.deadlocked)}: that fixed order deadlocks under "
                     f"blocking p2p.")
    if fixed_over:
        notes.append("* that hint's fixed order holds more memory than the budget (below), so this ratio is "
                     "not at equal memory.")
    console.print("[dim]" + " ".join(notes) + "[/]")
    if over:
        print_table(console, columns(False), [cells(r, False) for r in over],
                    title=f"over the budget (more memory; not comparable with the rows above); makespan in {unit}")


def _family_bounds(rows) -> str:
    """Each family's bound once, in the order rows meet them ([Note: bound per hint family])."""
    seen: dict[str, float] = {}
    for row in rows:
        seen.setdefault(row.bound_family, row.bound)
    return "; ".join(f"{family} {format_seconds(value)}" for family, value in seen.items())


def _memory(row, slots: list[int]) -> str:
    return f"{sum(row.peak_in_flight) / sum(slots):.2f}x"


def _compact(values: list[int]) -> str:
    if len(set(values)) == 1:
        return str(values[0])
    if len(values) <= 8:
        return ",".join(map(str, values))
    return f"{min(values)}..{max(values)}"
