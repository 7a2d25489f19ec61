"""One clock for every rank's times: the offset of this rank's monotonic clock to rank 0's.

Traces, decisions and per-iteration timings are written on rank 0's clock. :func:`measure_clock_offset`
measures each rank's offset by ping-pong: a collective over a group that moves CPU tensors, which imports
torch when called. Times inside messages need no common clock (a NOTICE's are relative), except a
DECISION's ``decided_ns``, which is on rank 0's.
"""

from __future__ import annotations

import time


def measure_clock_offset(rank: int, world: int, rounds: int = 8, group=None) -> tuple[int, int]:
    """This rank's clock offset to rank 0 (NTP-style ping-pong on the default group) and its error bound.

    Returns ``(offset_ns, error_ns)``: ``rank 0's monotonic time ~= local time + offset``, within
    ``error_ns`` (half of the best of ``rounds`` round trips). Collective: every rank must call it.
    ``group`` must move CPU tensors (gloo); None is the default group.
    """
    if world == 1:
        return 0, 0
    import torch
    import torch.distributed as dist

    stamps = torch.zeros(2, dtype=torch.int64)
    if rank == 0:
        for peer in range(1, world):
            for _ in range(rounds):
                dist.recv(stamps, peer, group=group)
                received = time.monotonic_ns()
                dist.send(torch.tensor([received, time.monotonic_ns()], dtype=torch.int64), peer, group=group)
        return 0, 0
    best: tuple[int, int] | None = None
    for _ in range(rounds):
        sent = time.monotonic_ns()
        dist.send(torch.tensor([sent, 0], dtype=torch.int64), 0, group=group)
        dist.recv(stamps, 0, group=group)
        back = time.monotonic_ns()
        received, replied = stamps.tolist()
        round_trip = (back - sent) - (replied - received)
        offset = ((received - sent) + (replied - back)) // 2
        if best is None or round_trip < best[1]:
            best = (offset, round_trip)
    return best[0], best[1] // 2
