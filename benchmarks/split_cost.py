"""What a split backward costs on real compute: ``(I + W) / B`` per stage, three ways side by side on the same
modules and inputs, and end to end from traces of ``rrfp run``.

    .venv/bin/python benchmarks/split_cost.py [--workloads gpt multimodal] [--stages 2] [--microbatches 8]
        [--iters 6] [--warmup 1] [--rounds 2] [--seq-len 32] [--hidden 64] [--layers-per-stage 1] [--pairs 15]
        [--ops N] [--no-runs] [--json FILE]

**Kernels** (first, in this process, one thread): each stage module of the workload (built as ``rrfp run``
builds it, with the same microbatch) runs a forward, then one backward, ``--pairs`` times for each of four
ways, taking turns in a rotating order: ``B`` (the fused backward), ``rrfp`` (this runtime's split, [Note:
split backward in the runtime] in :mod:`runtime.exec.split_backward`), ``torch`` (torch.distributed.pipelining's
``stage_backward_input`` / ``stage_backward_weight`` on the same module) and ``old`` (the split rrfp ran
before: ``I`` with the graph retained, then ``W`` from the outputs over it again). Reported per stage: the
median and quartiles of ``(I + W) / B``, each pair's ``I + W`` over the ``B`` of the same turn, and the
median ``B``, ``I`` and ``W`` in ms. Every way's gradients are checked against ``B``'s before anything is
timed. ``--ops N`` then profiles five more passes of ``B`` and of rrfp's split per stage (torch.profiler, apart
from the timed turns) and shows the ``N`` aten ops whose self CPU time grows most from one to the other: where
a split's extra time goes. ``--no-runs`` stops there.

**Runs** (then):

for each workload (the real ``gpt`` and ``multimodal`` models of :mod:`runtime.workloads.builtin`, CPU, gloo) it
runs, in one launch and taking turns (``--rounds`` times: full, split, full, split, ...), two fixed-order
jobs on the same model and data: ``1f1b`` (every backward a fused ``B``) and ``zb`` (every backward split
into ``I``, the input gradient sent upstream at once, and ``W``, the weight gradient, later; [Note: split
backward in the runtime] in :mod:`runtime.exec.split_backward`). It reads each task's duration from the jobs'
traces (:func:`profiler.trace.reader.read_trace`, the ``tasks`` frame: the handler's own time, no waiting) and
pairs the two jobs task by task: for each (round, stage, iteration, microbatch) after the warm-up,
``(I + W) / B``, ``I / B`` and ``W / B``, where ``B`` is that microbatch's fused backward on that stage in
the full job of the same round. Reported per stage, over all stages, and over the stages after the first
(the ones that compute an input gradient: stage 0's inputs are data): the median and the spread
(quartiles, min - max) of those ratios, the median ``B``, ``I``, ``W`` in ms, and the median step time of
the split job over the full one (what the split costs end to end, bubbles saved included).

The ratios are what :attr:`runtime.durations.variability.VariabilityModel.split_overhead` models
([Note: split backward durations] there). Both jobs share the machine the same way (same ranks, same
threads, taking turns), so the ratio is robust to a uniformly slow or fast machine; it is not robust to a
neighbour's load that comes and goes, hence the turns and the spread.

Output: Markdown on stdout (command, machine, one table per workload); ``--json FILE`` writes the same
numbers. Bad arguments print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch: no numpy here

import torch
from _cli import Parser, progress, run  # benchmarks/_cli.py: this script's folder is on sys.path

from profiler.trace.reader import read_trace
from runtime.config import RunConfig, run_shape
from runtime.exec.split_backward import SplitPlans, backward_input, backward_weight
from runtime.run.launch import launch
from runtime.run.worker import Job, WorkerOptions
from runtime.workloads.make import make_workload

try:  # torch.distributed.pipelining's split (a private module: older or newer torch may lack it)
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
except ImportError:
    stage_backward_input = stage_backward_weight = None

FULL, SPLIT = "1f1b", "zb"
TRACE_RECORDER = "profiler.trace.recorder:TraceRecorder"  # what `rrfp run` records with (rrfp_cli.cmd_run)


def jobs_for(workload: str, args: argparse.Namespace, out_root: Path) -> list[Job]:
    base = RunConfig(workload=workload, ranks=args.stages, microbatches=args.microbatches,
                     iters=args.warmup + args.iters, seed=args.seed, policy="fixed", hidden=args.hidden,
                     layers_per_stage=args.layers_per_stage, samples=args.samples, trace=True,
                     seq_len=args.seq_len if workload == "gpt" else None)
    jobs = []
    for round_index in range(args.rounds):
        for hint in (FULL, SPLIT):
            name = f"{hint}-r{round_index}"
            jobs.append(Job(name, base.with_overrides(hint=hint), str(out_root / workload / name),
                            recorder=TRACE_RECORDER))
    return jobs


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q1, median, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {"median": median, "q1": q1, "q3": q3, "min": ordered[0], "max": ordered[-1], "n": len(ordered)}


def task_seconds(run_dir: str, warmup: int) -> dict[tuple[int, str, int, int], float]:
    """(stage, kind letter, iteration, microbatch) -> seconds, for the iterations after the warm-up."""
    tasks = read_trace(run_dir).tasks
    return {(row["stage"], row["kind"], row["iteration"], row["microbatch"]): row["duration_ns"] * 1e-9
            for row in tasks.iter_rows(named=True) if row["iteration"] >= warmup}


def measure(workload: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="rrfp-split-") as tmp:
        root = Path(tmp)
        jobs = jobs_for(workload, args, root)
        progress(f"{workload}: {', '.join(job.name for job in jobs)}")
        options = WorkerOptions(out_root=str(root), show_progress=False, timeout=args.timeout, threads=1)
        results = launch(jobs, options, args.stages)[0]
        samples: dict[int, dict[str, list[float]]] = {}
        step_ratios, durations = [], {}
        for round_index in range(args.rounds):
            full_job, split_job = jobs[2 * round_index], jobs[2 * round_index + 1]
            full, split = task_seconds(full_job.out_dir, args.warmup), task_seconds(split_job.out_dir, args.warmup)
            for (stage, kind, iteration, mb), backward in full.items():
                if kind != "B":
                    continue
                inp, weight = split[(stage, "I", iteration, mb)], split[(stage, "W", iteration, mb)]
                per_stage = samples.setdefault(stage, {"split": [], "input": [], "weight": [], "B": [], "I": [],
                                                        "W": []})
                per_stage["split"].append((inp + weight) / backward)
                per_stage["input"].append(inp / backward)
                per_stage["weight"].append(weight / backward)
                per_stage["B"].append(backward)
                per_stage["I"].append(inp)
                per_stage["W"].append(weight)
            full_walls = [row["wall_seconds"] for row in results[full_job.name]["metrics"][args.warmup:]]
            split_walls = [row["wall_seconds"] for row in results[split_job.name]["metrics"][args.warmup:]]
            step_ratios.append(statistics.median(split_walls) / statistics.median(full_walls))
            durations[round_index] = (full_walls, split_walls)
    stages = {}
    pooled: dict[str, list[float]] = {"split": [], "input": [], "weight": []}
    later: dict[str, list[float]] = {"split": [], "input": [], "weight": []}  # stages that send an input gradient
    for stage in sorted(samples):
        values = samples[stage]
        stages[stage] = {name: quantiles(values[name]) for name in ("split", "input", "weight")}
        stages[stage].update({f"{kind}_ms": statistics.median(values[kind]) * 1e3 for kind in ("B", "I", "W")})
        for name in pooled:
            pooled[name] += values[name]
            if stage > 0:
                later[name] += values[name]
    return {"workload": workload, "stages": stages, "all": {name: quantiles(v) for name, v in pooled.items()},
            "after_stage_0": {name: quantiles(v) for name, v in later.items()},
            "split_step_over_full_step": step_ratios,
            "step_s": {str(r): {"full": f, "split": s} for r, (f, s) in durations.items()}}


# -- kernels: the four ways on the same module and inputs ------------------------------------------------------------

WAYS = ("B", "rrfp", "torch", "old")


class _Pass:
    """One forward of a stage on its microbatch: the leaves, the roots and their gradients, the parameters."""

    def __init__(self, module, workload, batch, inputs, last: bool, output_grads, plans: SplitPlans,
                 accumulate: bool = False) -> None:
        self.plans = plans  # the stage's graph readings, kept across passes as the runtime's handlers keep them
        if not accumulate:  # the first microbatch of an iteration; with accumulate, a later one: .grad is held
            module.zero_grad(set_to_none=True)
        self.inputs = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
        outputs = module(tuple(self.inputs), batch)
        if last:
            self.roots, self.grads = [workload.loss(outputs, batch)], None
        else:
            self.roots = [o for o in outputs if o.requires_grad]
            self.grads = [g for o, g in zip(outputs, output_grads) if o.requires_grad]
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.wanted = [x for x in self.inputs if x.requires_grad]

    def run(self, way: str) -> tuple[float, float]:
        """Seconds of (I, W); the fused backward's in I, W 0."""
        began = time.perf_counter()
        if way == "B":
            torch.autograd.backward(self.roots, self.grads)
            return time.perf_counter() - began, 0.0
        if way == "rrfp":
            _, pending = backward_input(self.roots, self.grads, self.inputs, self.params, self.plans)
            middle = time.perf_counter()
            backward_weight(pending)
        elif way == "torch":
            _, groups = stage_backward_input(self.roots, self.grads, self.inputs, iter(self.params))
            middle = time.perf_counter()
            stage_backward_weight(iter(self.params), groups)
        else:  # old
            if self.wanted:
                torch.autograd.grad(self.roots, self.wanted, self.grads, retain_graph=True, allow_unused=True)
            middle = time.perf_counter()
            grads = torch.autograd.grad(self.roots, self.params, self.grads, allow_unused=True)
            for param, grad in zip(self.params, grads):  # the old split's accumulation: a new sum each time
                if grad is not None:
                    param.grad = grad if param.grad is None else param.grad + grad
        return middle - began, time.perf_counter() - middle

    def gradients(self) -> list:
        return [p.grad for p in self.params]


def stage_modules(workload: str, args: argparse.Namespace):
    """The workload's stage modules, one microbatch, each stage's inputs and its output gradients."""
    config = RunConfig(workload=workload, ranks=args.stages, microbatches=args.microbatches, seed=args.seed,
                       hidden=args.hidden, layers_per_stage=args.layers_per_stage, samples=args.samples,
                       seq_len=args.seq_len if workload == "gpt" else None, hint="zb")
    model = make_workload(config, run_shape(config))
    model.prepare(list(range(args.stages)))
    batch = model.batch(0, 0)
    generator = torch.Generator().manual_seed(args.seed)
    stages, inputs = [], list(model.first_inputs(batch))
    for stage in range(args.stages):
        module = model.build_stage(stage)
        with torch.no_grad():
            outputs = module(tuple(inputs), batch)
        grads = [torch.randn(o.shape, generator=generator) for o in outputs]
        stages.append((module, inputs, grads))
        inputs = [o.detach() for o in outputs]
    return model, batch, stages


def kernel_costs(workload: str, args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    model, batch, stages = stage_modules(workload, args)
    importable = [way for way in WAYS if way != "torch" or stage_backward_input is not None]
    result: dict = {"workload": workload, "stages": {}, "notes": []}
    if "torch" not in importable:
        result["notes"].append("torch: not in this torch (torch.distributed.pipelining._backward)")
    for index, (module, inputs, grads) in enumerate(stages):
        available = list(importable)
        last = index == len(stages) - 1
        plans = SplitPlans()

        def forward(accumulate: bool = False):
            return _Pass(module, model, batch, inputs, last, grads, plans, accumulate)

        reference = forward()
        reference.run("B")
        expected = reference.gradients()
        for way in available[1:]:
            check = forward()
            check.run(way)
            got = check.gradients()
            if any((a is None) != (b is None) or (a is not None and not torch.allclose(a, b, rtol=1e-4, atol=1e-6))
                   for a, b in zip(got, expected)):
                if way != "torch":
                    raise SystemExit(f"error: {workload} stage {index}: the {way} split's gradients differ from B's")
                # torch's W starts only from nodes on the input path: where the inputs are data, it computes no
                # weight gradient (torch's schedules run such a stage's backward whole); not timed there
                available.remove(way)
                result["notes"].append(f"stage {index}: torch's split computes no weight gradient (the stage's "
                                       f"inputs are data), so it is not timed there")
        seconds: dict[str, list[tuple[float, float]]] = {way: [] for way in available}
        params = [p for p in module.parameters() if p.requires_grad]
        held: dict[str, list] = {way: [None] * len(params) for way in available}  # --accumulate: each way's own
        for pair in range(args.warmup + args.pairs):
            turn = available[pair % len(available):] + available[:pair % len(available)]
            for way in turn:
                for param, grad in zip(params, held[way]):  # (untimed) the gradients this way accumulated so far
                    param.grad = grad
                step = forward(args.accumulate)
                spent = step.run(way)
                held[way] = [param.grad for param in params]
                if pair >= args.warmup:
                    seconds[way].append(spent)
        fused = [i for i, _ in seconds["B"]]
        stage_result = {"B_ms": statistics.median(fused) * 1e3}
        for way in available[1:]:
            ratios = [(i + w) / b for (i, w), b in zip(seconds[way], fused)]
            stage_result[way] = {"split": quantiles(ratios),
                                 "I_ms": statistics.median(i for i, _ in seconds[way]) * 1e3,
                                 "W_ms": statistics.median(w for _, w in seconds[way]) * 1e3}
        stage_result["ways"] = available
        if args.ops and "rrfp" in available:
            stage_result["ops"] = op_times(forward, args.ops)
        result["stages"][index] = stage_result
    result["ways"] = importable
    return result


def op_times(forward, top: int, passes: int = 5) -> list[dict]:
    """Self CPU time per aten op (torch.profiler, ``passes`` passes of each way, after the timed turns and apart
    from them): the ``top`` ops whose time grows most from ``B`` to rrfp's split, then all aten ops together."""
    from torch.profiler import ProfilerActivity, profile

    spent: dict[str, dict[str, float]] = {}
    for way in ("B", "rrfp"):
        for _ in range(passes):
            step = forward()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step.run(way)
            for event in prof.key_averages():
                if event.key.startswith("aten::"):
                    per_way = spent.setdefault(event.key, {"B": 0.0, "rrfp": 0.0})
                    per_way[way] += event.self_cpu_time_total / passes
    rows = sorted(({"op": op, "B_us": t["B"], "rrfp_us": t["rrfp"]} for op, t in spent.items()),
                  key=lambda row: row["B_us"] - row["rrfp_us"])[:top]
    rows.append({"op": "all aten ops", "B_us": sum(t["B"] for t in spent.values()),
                 "rrfp_us": sum(t["rrfp"] for t in spent.values())})
    return rows


def print_kernels(result: dict, args: argparse.Namespace) -> None:
    print(f"\n### {result['workload']}: kernels, {args.stages} stages, one thread, {args.pairs} turns of "
          f"({', '.join(result['ways'])}) after {args.warmup} warm-up\n")
    print("| stage | way | (I+W)/B median | quartiles | min - max | B ms | I ms | W ms | n |")
    print("|---|---|---|---|---|---|---|---|---|")
    for stage, values in result["stages"].items():
        for way in values["ways"][1:]:
            v = values[way]
            print(f"| {stage} | {way} | {cell(v['split'])} | {values['B_ms']:.2f} | {v['I_ms']:.2f} "
                  f"| {v['W_ms']:.2f} | {v['split']['n']} |")
    for note in result["notes"]:
        print(f"\n* {note}")
    for stage, values in result["stages"].items():
        if "ops" in values:
            print(f"\nStage {stage}, self CPU time per aten op (torch.profiler, 5 passes of each way), the ops that "
                  f"grow most from B to rrfp's I + W:\n")
            print("| op | B us | rrfp us | rrfp - B us |")
            print("|---|---|---|---|")
            for row in values["ops"]:
                fused, split = row["B_us"], row["rrfp_us"]
                print(f"| {row['op']} | {fused:.0f} | {split:.0f} | {split - fused:+.0f} |")


def cell(q: dict[str, float]) -> str:
    return f"{q['median']:.3f} | {q['q1']:.3f} - {q['q3']:.3f} | {q['min']:.3f} - {q['max']:.3f}"


def print_workload(result: dict, args: argparse.Namespace) -> None:
    print(f"\n### {result['workload']}: {args.stages} stages, {args.microbatches} microbatches, {args.iters} "
          f"measured iterations after {args.warmup} warm-up, {args.rounds} round(s) of (1f1b, zb)\n")
    print("| stage | (I+W)/B median | quartiles | min - max | I/B median | W/B median | B ms | I ms | W ms | n |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = [(str(stage), values, values) for stage, values in result["stages"].items()]
    rows += [("all", result["all"], None), ("1 and later", result["after_stage_0"], None)]
    for label, values, timing in rows:
        times = (f"{timing['B_ms']:.2f} | {timing['I_ms']:.2f} | {timing['W_ms']:.2f}" if timing
                 else "- | - | -")
        print(f"| {label} | {cell(values['split'])} | {values['input']['median']:.3f} "
              f"| {values['weight']['median']:.3f} | {times} | {values['split']['n']} |")
    ratios = ", ".join(f"{r:.3f}" for r in result["split_step_over_full_step"])
    print(f"\nMedian step time, zb over 1f1b, per round: {ratios} (> 1: the split job is slower end to end).")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=("gpt", "multimodal"), default=["gpt", "multimodal"])
    parser.add_argument("--stages", type=int, default=2, help="pipeline ranks = processes (default 2)")
    parser.add_argument("--microbatches", type=int, default=8, help="per iteration (default 8)")
    parser.add_argument("--iters", type=int, default=6, help="measured iterations per job (default 6)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up iterations, not measured (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="(1f1b, zb) pairs, taking turns (default 2)")
    parser.add_argument("--seq-len", type=int, default=32, help="gpt sequence length (default 32)")
    parser.add_argument("--hidden", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers-per-stage", type=int, default=1, help="blocks per stage (default 1)")
    parser.add_argument("--samples", type=int, default=2, help="samples per microbatch (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="stall timeout, seconds")
    parser.add_argument("--pairs", type=int, default=15, help="kernels: turns of the four ways per stage (default 15)")
    parser.add_argument("--ops", type=int, default=0, metavar="N",
                        help="kernels: also profile B and rrfp's split per aten op; show the N that grow most")
    parser.add_argument("--no-runs", action="store_true", help="the kernels only, no rrfp run jobs")
    parser.add_argument("--accumulate", action="store_true",
                        help="kernels: time every pass with the gradients of earlier passes held, as for every "
                             "microbatch of an iteration but its first (default: each pass from zero_grad)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    parser.at_least(args, 0, "ops")
    parser.at_least(args, 1, "stages", "microbatches", "iters", "rounds", "seq_len", "hidden", "layers_per_stage",
                    "samples", "pairs")
    if args.stages < 2 or args.warmup < 0:
        parser.error("need --stages >= 2 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    began = time.perf_counter()
    print("## Split backward cost on real compute: (I + W) / B\n")
    print(f"Command: `{shlex.join(sys.orig_argv)}`\n")
    print(f"Machine: {platform.platform()} ({platform.machine()}), {os.cpu_count()} CPUs, CPython "
          f"{platform.python_version()}, torch {torch.__version__}, gloo; gpt/multimodal hidden {args.hidden}, "
          f"{args.layers_per_stage} block(s) per stage, {args.samples} samples per microbatch"
          + (f", gpt seq-len {args.seq_len}" if "gpt" in args.workloads else ""))
    results = {"kernels": [], "runs": []}
    for workload in args.workloads:
        progress(f"{workload}: kernels")
        results["kernels"].append(kernel_costs(workload, args))
        print_kernels(results["kernels"][-1], args)
        sys.stdout.flush()
    for workload in [] if args.no_runs else args.workloads:
        results["runs"].append(measure(workload, args))
        print_workload(results["runs"][-1], args)
        sys.stdout.flush()
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nTotal run time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    run(main)
