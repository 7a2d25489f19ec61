"""The CUDA path, checked on a machine with a GPU: results, CUDA-event traces, NCCL set-up.

    python benchmarks/device_check.py --out DIR

1. Correctness on CUDA: gpt and multimodal, 2 ranks (on one GPU the ranks
   share it and gloo stages tensors through host memory), 1 and 2 chunks
   (looping, and V placement with zbv), fixed and ready, against the
   single-process reference computed on the CPU (GPU and CPU kernels differ
   in rounding: rtol 1e-4, atol 1e-5).
2. A traced `rrfp run --device cuda`: the trace must say its compute slices
   come from CUDA events, and their durations must be consistent with the
   host-side spans.
3. NCCL: a one-rank run (two chunks on one GPU) through the NCCL backend, and
   a two-rank NCCL run, which needs one GPU per rank (a failure only where
   there are two GPUs; otherwise reported as what happened).
4. Link streams ([Note: CUDA streams] in runtime/comm/links.py): two ranks
   ping-pong CUDA tensors through the Transport, each reply computed from
   the message before it, while each rank's next receive is already posted.
   Before receives had their own streams this deadlocked under NCCL (the
   compute stream waited for a receive that needed its own result); every
   round must come back, with the right values, and posting a send must not
   wait for the kernels that compute it. Over gloo (tensors staged through
   the host, one GPU is enough) and over NCCL (needs two GPUs; where there
   is one it is reported as not run). A deadlock is caught by a time limit.

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

from _cli import Parser, run

ROOT = Path(__file__).resolve().parent.parent


def rrfp(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rrfp_cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def correctness(lines: list[str], work: Path, device: str) -> bool:
    import torch

    from runtime.config import RunConfig, run_shape
    from runtime.run.launch import launch
    from runtime.run.worker import Job, WorkerOptions
    from runtime.workloads.make import reference_train

    jobs = []
    for workload in ("gpt", "multimodal"):
        for chunks, hints in ((1, ("1f1b", "zb")), (2, ("interleaved-1f1b", "bfw", "zbv"))):
            for hint in hints:
                for policy in ("fixed", "ready"):
                    config = RunConfig(workload=workload, ranks=2, chunks=chunks, microbatches=4, hint=hint,
                                       policy=policy, iters=2, device=device)  # zbv: V placement (its own)
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

    from profiler.trace.reader import read_trace

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
    import torch

    one = rrfp("run", "--workload", "gpt", "--stages", "1", "--chunks", "2", "--microbatches", "4", "--iters", "2",
               "--device", "cuda", "--backend", "nccl", "--out", str(work / "nccl1"), "--json")
    lines.append(f"NCCL, one rank, two chunks: exit {one.returncode}"
                 + ("" if one.returncode == 0 else f": {one.stderr.strip()[-800:]}"))
    two = rrfp("run", "--workload", "gpt", "--stages", "2", "--microbatches", "4", "--iters", "2", "--device",
               "cuda", "--backend", "nccl", "--timeout", "30", "--out", str(work / "nccl2"), "--json", timeout=180)
    tail = (two.stderr.strip().splitlines() or ["(no output)"])[:3]
    gpus = torch.cuda.device_count()
    lines.append(f"NCCL, two ranks on {gpus} GPU(s): exit {two.returncode}: " + " | ".join(tail)[:800])
    # With a GPU per rank this run crosses NCCL links, where receives on the compute stream deadlocked.
    return one.returncode == 0 and (two.returncode == 0 or gpus < 2)


PINGPONG_ROUNDS = 20
PINGPONG_SECONDS = 180  # a deadlock is caught here


def _slow(x, weight):
    """Enough kernels on the current stream that a send posted after them would visibly wait for them."""
    for _ in range(8):
        x = (x @ weight).tanh()
    return x


class _Span:
    """Milliseconds of the work queued between start() and stop(): CUDA events, or host time on the CPU."""

    def __init__(self, device) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if self.cuda else []
        self.host = [0.0, 0.0]

    def start(self) -> None:
        self._mark(0)

    def stop(self) -> None:
        self._mark(1)

    def _mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        self.host[i] = time.perf_counter()

    def ms(self) -> float:
        return self.events[0].elapsed_time(self.events[1]) if self.cuda else (self.host[1] - self.host[0]) * 1e3


def _pingpong_rank(backend: str, device_type: str) -> dict:
    """One rank of the ping-pong: rank 0 sends, rank 1 computes a reply from what came, and so on."""
    import torch
    import torch.distributed as dist

    from hints.tasks import B, F, Task
    from runtime.comm.transport import Transport

    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
    transport = Transport(rank, [(0, 1), (1, 0)], device, timeout=60)
    transport.start(timeout=60)
    rows, width = (4096, 4096) if device.type == "cuda" else (64, 256)  # GPU: ~10 ms of kernels per message
    generator = torch.Generator(device="cpu").manual_seed(0)
    weight = (torch.randn(width, width, generator=generator) / width ** 0.5).to(device)
    x = torch.randn(rows, width, generator=generator).to(device)
    posts, spans = [], []

    def receive():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for arrival in transport.inbox.drain():
                return arrival.take()[0].to(device)  # gloo stages through the host, as the executor moves it
            transport.inbox.wait(1.0)
        raise TimeoutError(f"rank {rank}: no message within 60 s")

    def compute_and_post(value, task):
        span = _Span(device)
        span.start()
        result = _slow(value, weight)
        span.stop()
        posted = time.perf_counter()
        transport.send(1 - rank, 0, task, (result,))  # on CUDA: returns before the kernels above are done
        posts.append(time.perf_counter() - posted)
        spans.append(span)
        return result

    value = x
    for i in range(PINGPONG_ROUNDS):
        if rank == 0:
            compute_and_post(value, Task(0, F, i))
            value = receive()
        else:
            value = compute_and_post(receive(), Task(1, B, i))
    if device.type == "cuda":
        torch.cuda.synchronize()
    transport.wait_sent(timeout=60)
    expected = x
    for _ in range(2 * PINGPONG_ROUNDS):
        expected = _slow(expected, weight)
    result = {"rank": rank, "rounds": PINGPONG_ROUNDS,
              "post_ms": statistics.median(posts) * 1e3,
              "kernel_ms": statistics.median(span.ms() for span in spans),
              "values_ok": rank != 0 or bool(torch.allclose(value, expected, rtol=1e-3, atol=1e-4))}
    dist.barrier()
    transport.close()
    dist.destroy_process_group()
    return result


def _pingpong(backend: str, device_type: str) -> None:
    """``--pingpong BACKEND``: run the two ranks and print rank 0's result as one JSON line."""
    import json

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from runtime.run.launch import free_port

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                          rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, run_id="pingpong")
    print(json.dumps(elastic_launch(config, _pingpong_rank)(backend, device_type)[0]))


def _bounded(command: list[str], seconds: float) -> tuple[int | None, str]:
    """Run ``command`` in its own process group; kill the whole group after ``seconds`` (None: it was killed)."""
    import signal

    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=seconds)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output


def streams(lines: list[str], device: str) -> bool:
    import json

    import torch

    ok = True
    for backend in ("gloo", "nccl") if device == "cuda" else ("gloo",):
        if backend == "nccl" and torch.cuda.device_count() < 2:
            lines.append("NCCL ping-pong: not run (needs a GPU per rank, 2)")
            continue
        began = time.perf_counter()
        code, output = _bounded([sys.executable, __file__, "--pingpong", backend, "--device", device],
                                PINGPONG_SECONDS)
        seconds = time.perf_counter() - began
        if code is None:
            lines.append(f"{backend} ping-pong: DEADLOCK, no end within {PINGPONG_SECONDS} s")
            ok = False
            continue
        result = json.loads(output.strip().splitlines()[-1]) if code == 0 else None
        if result is None:
            lines.append(f"{backend} ping-pong failed (exit {code}): {output.strip()[-1500:]}")
            ok = False
            continue
        # Posting must not wait for the kernels computing the message: well under their time. On the
        # CPU the kernels ran before the post, so there is nothing to check but the values (a dry run).
        good = result["values_ok"] and (device != "cuda" or result["post_ms"] < result["kernel_ms"] / 4)
        lines.append(f"{backend} ping-pong: {result['rounds']} rounds in {seconds:.0f} s, values "
                     f"{'equal' if result['values_ok'] else 'DIFFER'}, posting a send {result['post_ms']:.2f} ms "
                     f"vs {result['kernel_ms']:.2f} ms of kernels before it{'' if good else ' (FAIL)'}")
        ok &= good
    return ok


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a dry run of checks 1, 2 and 4 (gloo) without a GPU")
    parser.add_argument("--pingpong", choices=("gloo", "nccl"), help=argparse.SUPPRESS)  # check 4's child
    args = parser.parse_args()
    if args.pingpong:
        _pingpong(args.pingpong, args.device)
        return
    if not args.out:
        parser.error("--out is required")
    out = Path(args.out)
    parser.folder(out, "--out")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here (--device cpu is the dry run)")
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/rrfp-device")

    lines = [f"# rrfp device check\n\ntorch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}, "
             f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n"]
    checks = {}
    checks_to_run = [("correctness", lambda: correctness(lines, work / "c", args.device)),
                     ("trace", lambda: traced_run(lines, work, out, args.device))]
    if args.device == "cuda":
        checks_to_run.append(("nccl", lambda: nccl(lines, work)))
    checks_to_run.append(("streams", lambda: streams(lines, args.device)))
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
    run(main)
