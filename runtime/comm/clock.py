"""One clock for every rank's times: the offset of this rank's monotonic clock to rank 0's.

Traces, decisions and per-iteration timings are written on rank 0's clock. :func:`measure_clock_offset`
measures each rank's offset by ping-pong; :func:`clock_domain` decides which offset a rank applies
([Note: one clock domain]: none on rank 0's host), :func:`choose_clock_offset` being that rule for one rank.
Both are collectives over a group that moves CPU tensors; they import torch when called, so the rule
itself is importable without it. Times inside messages need no common clock (a NOTICE's are relative),
except a DECISION's ``decided_ns``, which is on rank 0's.
"""

from __future__ import annotations

import time
from pathlib import Path


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


def clock_domain(measured: tuple[int, int], group) -> tuple[int, int]:
    """The offset to rank 0's clock that this rank applies, and its error bound.

    [Note: one clock domain] Ranks on one host read the same monotonic clock
    (same kernel boot: ``/proc/sys/kernel/random/boot_id``), so their offset
    is exactly 0: applying the ping-pong's estimate there would only add its
    error, and make messages arrive before they were sent. Across hosts the
    measured offset is applied only when it exceeds its error bound. A
    collective: every rank calls it.
    """
    import torch
    import torch.distributed as dist

    mine = torch.tensor([_boot_id()], dtype=torch.int64)
    boots = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(boots, mine, group=group)
    return choose_clock_offset(measured, mine.item(), boots[0].item())


def choose_clock_offset(measured: tuple[int, int], boot: int, rank0_boot: int) -> tuple[int, int]:
    """[Note: one clock domain] for one rank: its measured ``(offset, error)``, its boot and rank 0's."""
    offset, error = measured
    if boot != 0 and boot == rank0_boot:
        return 0, 0
    return (offset if abs(offset) > error else 0), error


def _boot_id() -> int:
    """This host's boot, as a 63-bit number (0 if unknown: then offsets are measured as across hosts)."""
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return int(text.replace("-", ""), 16) >> 65 or 1
    except (OSError, ValueError):
        return 0
