"""The CUDA path, checked on a machine with a GPU: results, CUDA-event traces, NCCL set-up.

    python benchmarks/device_check.py --out DIR

1. Correctness on CUDA: gpt and multimodal, 2 ranks (on one GPU the ranks
   share it and gloo stages tensors through host memory), 1 and 2 chunks,
   fixed and ready, against the single-process reference computed on the CPU
   (GPU and CPU kernels differ in rounding: rtol 1e-4, atol 1e-5).
2. A traced `rrfp run --device cuda`: the trace must say its compute slices
   come from CUDA events, and their durations must be consistent with the
   host-side spans.
3. NCCL: a one-rank run (two chunks on one GPU) through the NCCL backend, and
   a two-rank NCCL run, which needs one GPU per rank (reported as what
   happened).

Writes a report to DIR/device_report.md and prints it. Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rrfp(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rrfp_cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def correctness(lines: list[str], work: Path, device: str) -> bool:
    import torch

    from runtime.config import RunConfig
    from runtime.launch import launch
    from runtime.plan import run_shape
    from runtime.workloads import reference_train
    from runtime.worker import Job, WorkerOptions

    jobs = []
    for workload in ("gpt", "multimodal"):
        for chunks, hints in ((1, ("1f1b", "zb")), (2, ("interleaved-1f1b", "bfw"))):
            for hint in hints:
                for policy in ("fixed", "ready"):
                    config = RunConfig(workload=workload, stages=2, chunks=chunks, microbatches=4, hint=hint,
                                       policy=policy, iters=2, device=device)
                    name = f"{workload}-v{chunks}-{hint}-{policy}"
                    jobs.append(Job(name, config, str(work / name), collect_grads=True))
    began = time.perf_counter()
    results = launch(jobs, WorkerOptions(str(work), timeout=120), 2)
    lines.append(f"{len(jobs)} jobs on 2 ranks in {time.perf_counter() - began:.0f} s\n")
    lines.append("| job | max relative gradient error vs CPU reference | losses equal (rtol 1e-4) |")
    lines.append("|---|---|---|")
    ok = True
    for job in jobs:
        cpu_config = job.config.with_overrides(device="cpu")
        losses, grads = reference_train(cpu_config, run_shape(cpu_config), cpu_config.iters)
        got = {}
        for rank_results in results.values():
            got.update(rank_results[job.name]["grads"])
        worst = 0.0
        good = got.keys() == grads.keys()
        for name, grad in grads.items():
            try:
                torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-5)
            except AssertionError:
                good = False
            scale = grad.abs().max().item() or 1.0
            worst = max(worst, (got[name] - grad).abs().max().item() / scale)
        run_losses = results[0][job.name]["losses"]
        losses_ok = all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(run_losses, losses))
        ok &= good and losses_ok
        lines.append(f"| {job.name} | {worst:.2e} {'' if good else '(FAIL)'} | {losses_ok} |")
    return ok


def traced_run(lines: list[str], work: Path, out: Path, device: str) -> bool:
    import polars as pl

    from profiler.reader import read_trace

    run = work / "traced"
    done = rrfp("run", "--workload", "gpt", "--stages", "2", "--microbatches", "8", "--iters", "4",
                "--device", device, "--hidden", "256", "--out", str(run), "--json")
    if done.returncode != 0:
        lines.append(f"traced run failed: {done.stderr[-2000:]}")
        return False
    frames = read_trace(run)
    timing = {m["timing"] for m in frames.meta.values()}
    tasks = frames.tasks.filter(pl.col("iteration") > 0)
    # Device spans must sit inside the host-side iteration windows and be at most the host span (plus
    # the alignment error), since the host span waits for the kernels only at the next sync.
    inside = tasks.join(frames.iterations, on=["rank", "iteration"]).filter(
        (pl.col("start_ns") >= pl.col("start_ns_right") - 1_000_000) & (pl.col("end_ns") <= pl.col("end_ns_right")
                                                                        + 50_000_000))
    durations = tasks.get_column("duration_ns").to_list()
    lines.append(f"trace timing: {sorted(timing)}; {tasks.height} task slices after the first iteration; "
                 f"{inside.height} inside their iteration window; median device duration "
                 f"{statistics.median(durations) / 1e3:.0f} us; clock alignment within "
                 f"{max(m['clock_error_ns'] for m in frames.meta.values()) / 1e3:.0f} us")
    summary = rrfp("trace", "summary", str(run))
    lines.append("```\n" + summary.stdout.strip() + "\n```")
    (out / "cuda_trace.pftrace").write_bytes((run / "trace.pftrace").read_bytes())
    expected = {"cuda-events"} if device == "cuda" else {"host"}
    return timing == expected and inside.height == tasks.height and min(durations) > 0


def nccl(lines: list[str], work: Path) -> bool:
    one = rrfp("run", "--workload", "gpt", "--stages", "1", "--chunks", "2", "--microbatches", "4", "--iters", "2",
               "--device", "cuda", "--backend", "nccl", "--out", str(work / "nccl1"), "--json")
    lines.append(f"NCCL, one rank, two chunks: exit {one.returncode}"
                 + ("" if one.returncode == 0 else f": {one.stderr.strip()[-800:]}"))
    two = rrfp("run", "--workload", "gpt", "--stages", "2", "--microbatches", "4", "--iters", "2", "--device",
               "cuda", "--backend", "nccl", "--timeout", "30", "--out", str(work / "nccl2"), "--json", timeout=180)
    tail = (two.stderr.strip().splitlines() or ["(no output)"])[:3]
    lines.append(f"NCCL, two ranks on one GPU: exit {two.returncode}: " + " | ".join(tail)[:800])
    return one.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of checks 1 and 2 without a GPU")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/rrfp-device")
    import torch

    lines = [f"# rrfp device check\n\ntorch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}, "
             f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n"]
    checks = {}
    checks_to_run = [("correctness", lambda: correctness(lines, work / "c", args.device)),
                     ("trace", lambda: traced_run(lines, work, out, args.device))]
    if args.device == "cuda":
        checks_to_run.append(("nccl", lambda: nccl(lines, work)))
    for name, check in checks_to_run:
        lines.append(f"\n## {name}\n")
        try:
            checks[name] = check()
        except Exception as err:  # report and go on: one failing check must not hide the others
            checks[name] = False
            lines.append(f"{name} raised {type(err).__name__}: {err}")
    lines.append("\n## verdict\n\n" + ", ".join(f"{k}: {'ok' if v else 'FAILED'}" for k, v in checks.items()))
    report = "\n".join(lines) + "\n"
    (out / "device_report.md").write_text(report)
    print(report)
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
