"""torch.distributed.pipelining's schedule names as rrfp accepts them, and which of them place stages in a V.

Pure data, so that reading a ``--hint torch:NAME`` (its placement) needs neither torch nor the importer
(:mod:`hints.files.torch_import`, which builds the order and imports torch).
"""

from __future__ import annotations

TORCH_PREFIX = "torch:"  # --hint torch:SCHEDULE

# torch schedule names accepted by `rrfp hints import` (torch's own names, case-insensitive).
TORCH_SCHEDULES = (
    "1F1B",
    "GPipe",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
V_SCHEDULES = frozenset({"zbvzerobubble", "dualpipev"})  # lower case, without "Schedule": V placement
