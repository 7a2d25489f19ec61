"""Why rrfp's TP layers are plain column/row-parallel linears, not DTensor: the cost per task on CPU (gloo).

    python benchmarks/tp_dtensor.py [--iters 50]

Two processes (gloo, CPU) each hold half of an MLP (64 -> 256 -> 64, a ``--hidden 64`` block's MLP) and run
forward + backward on a [2, 32, 64] microbatch, three ways: the whole MLP on one process (no TP), rrfp's
plain layers (``runtime.workloads.tp_layers``: explicit all-reduces in custom autograd functions), and
``torch.distributed.tensor.parallel`` (``ColwiseParallel`` + ``RowwiseParallel`` on a ``DeviceMesh`` of the
TP group). It also checks that DTensor gives the whole MLP's output and survives the executor's split
backward (``I`` then ``W`` by ``autograd.grad`` with the graph retained). Prints ms per forward+backward.
"""

from __future__ import annotations

import os
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import Parser, run  # noqa: E402


def _worker(rank: int, port: int, iters: int, out) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from runtime.workloads.tp_layers import TPShard, _shard, copy_to_group, reduce_from_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    group = dist.new_group([0, 1])
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    dtensor = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    dtensor.load_state_dict(whole.state_dict())
    parallelize_module(dtensor, DeviceMesh.from_group(group, "cpu"), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    shard = TPShard(rank, 2, group)
    w1, b1 = _shard(whole[0].weight, (0, 1), shard), _shard(whole[0].bias, (0, 1), shard)
    w2, b2 = _shard(whole[2].weight, (1, 1), shard), whole[2].bias.detach().clone().requires_grad_()

    def plain(x):
        h = F.gelu(F.linear(copy_to_group(x, group), w1, b1))
        return reduce_from_group(F.linear(h, w2), group) + b2

    x = torch.randn(2, 32, 64, requires_grad=True)
    y = dtensor(x)
    agree = max((y - whole(x)).abs().max().item(), (plain(x) - whole(x)).abs().max().item())
    torch.autograd.grad(y.sum(), [x], retain_graph=True)  # I
    torch.autograd.grad(y.sum(), list(dtensor.parameters()))  # W, on the retained graph
    timings = {}
    for name, fn in (("whole MLP, one process", whole), ("rrfp plain column/row-parallel", plain),
                     ("DTensor ColwiseParallel + RowwiseParallel", dtensor)):
        for _ in range(5):
            fn(torch.randn(2, 32, 64, requires_grad=True)).sum().backward()
        dist.barrier()
        began = time.perf_counter()
        for _ in range(iters):
            fn(torch.randn(2, 32, 64, requires_grad=True)).sum().backward()
        timings[name] = (time.perf_counter() - began) / iters * 1e3
    if rank == 0:
        out.put((timings, agree))
    dist.destroy_process_group()


def _result(out, processes) -> tuple[dict, float]:
    """Rank 0's timings, or one error line (exit 1) as soon as a rank has ended without them."""
    while True:
        try:
            return out.get(timeout=0.5)
        except queue.Empty:
            ended = [(rank, p.exitcode) for rank, p in enumerate(processes) if p.exitcode is not None]
            failed = [(rank, code) for rank, code in ended if code != 0]
            if failed:
                rank, code = failed[0]
                raise SystemExit(f"error: rank {rank} exited with {code} before rank 0 reported (its traceback is "
                                 f"above)")
            if len(ended) == len(processes):
                raise SystemExit("error: both ranks exited without a result")


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    parser.at_least(args, 1, "iters")
    import torch.multiprocessing as mp

    from runtime.run.launch import free_port

    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    processes = [context.Process(target=_worker, args=(rank, port, args.iters, out)) for rank in range(2)]
    for p in processes:
        p.start()
    try:
        timings, agree = _result(out, processes)
    except BaseException:  # a rank that failed leaves the other blocked in a collective: stop it, not wait for ever
        for p in processes:
            p.terminate()
        raise
    for p in processes:  # rank 0 reported: both are tearing their group down
        p.join(60)
    print(f"outputs agree with the whole MLP within {agree:.1e}; DTensor ran the split backward (I, then W)")
    for name, ms in timings.items():
        print(f"{name:45s} {ms:7.2f} ms per forward+backward")


if __name__ == "__main__":
    run(main)
