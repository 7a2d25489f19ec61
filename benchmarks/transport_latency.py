"""One-way latency of a small message: rrfp's transport against plain gloo send/recv.

    .venv/bin/python benchmarks/transport_latency.py [--messages 500] [--floats 512]

Two ranks on this machine ping-pong ``--messages`` messages of ``--floats``
float32 values, first with ``dist.send``/``dist.recv`` on the main threads,
then through :class:`runtime.transport.Transport` (queue to the sender
thread, frame on the wire, receiver thread, inbox, dispatcher wakes up).
Prints the median one-way time (half the round trip) of each.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from runtime.launch import free_port


def worker(messages: int, floats: int) -> tuple[float, float]:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.distributed as dist

    from hints.tasks import F, Task
    from runtime.transport import Transport

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    payload = torch.zeros(floats)

    def median_one_way(exchange) -> float:
        times = []
        for i in range(messages):
            began = time.perf_counter()
            exchange(i)
            times.append(time.perf_counter() - began)
        return statistics.median(times) / 2

    def raw(i: int) -> None:
        if rank == 0:
            dist.send(payload, 1)
            dist.recv(payload, 1)
        else:
            dist.recv(payload, 0)
            dist.send(payload, 0)

    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=30)
    transport.start(timeout=30)
    dist.barrier()

    def receive() -> None:
        while not transport.inbox.drain():
            transport.inbox.wait(1.0)

    def through_transport(i: int) -> None:
        if rank == 0:
            transport.send(1, 0, Task(0, F, i), (payload,))
            receive()
        else:
            receive()
            transport.send(0, 0, Task(1, F, i), (payload,))

    dist.barrier()
    plain = median_one_way(raw)
    dist.barrier()
    ours = median_one_way(through_transport)
    transport.close()
    dist.barrier()
    dist.destroy_process_group()
    return plain, ours


def main() -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--floats", type=int, default=512)
    args = parser.parse_args()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                          rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, run_id="latency")
    plain, ours = elastic_launch(config, worker)(args.messages, args.floats)[0]
    print(f"| path | median one-way latency ({args.floats * 4} B, {args.messages} round trips) |")
    print("|---|---|")
    print(f"| gloo dist.send / dist.recv | {plain * 1e6:.0f} us |")
    print(f"| rrfp Transport (threads, frame, inbox) | {ours * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
