"""Regenerate the golden files: `python tests/golden/make_golden.py` (review the diff before committing).

builtin_orders.json: the text order of every built-in hint on a few shapes (looping and V placement).
sim_makespans.json: fixed/ready makespans of every built-in on seeded workloads.
"""

from __future__ import annotations

import json
from pathlib import Path

from hints.orders import applicable_builtins, builtin_hint
from hints.tasks import LOOPING, V
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.simulator import simulate

HERE = Path(__file__).parent
ORDER_SHAPES = [(4, 1, 8, LOOPING), (3, 1, 5, LOOPING), (4, 2, 8, LOOPING), (2, 3, 4, LOOPING), (4, 2, 8, V),
                (3, 2, 4, V)]
SIM_CASES = [
    ("multimodal", 4, 1, 8, 0.2, 0.001, LOOPING),
    ("language", 4, 2, 8, 0.1, 0.0, LOOPING),
    ("uniform", 3, 1, 6, 0.3, 0.002, LOOPING),
    ("multimodal", 4, 2, 8, 0.2, 0.001, V),
    ("language", 3, 2, 6, 0.1, 0.002, V),
]


def _key(p: int, v: int, m: int, placement: str) -> str:
    return f"p={p} v={v} m={m}" + (" placement=v" if placement == V else "")


def builtin_orders() -> dict:
    golden = {}
    for p, v, m, placement in ORDER_SHAPES:
        for name, hint in applicable_builtins(p, v, m, placement=placement).items():
            golden[f"{name} {_key(p, v, m, placement)}"] = [" ".join(o) for o in hint.text_orders()]
    return golden


def sim_makespans() -> dict:
    golden = {}
    for workload, p, v, m, jitter, latency, placement in SIM_CASES:
        # The free split the golden makespans were recorded with (they pin the simulator, not the split's price).
        model = VariabilityModel(workload=workload, jitter=jitter, comm_latency=latency, split_overhead=1.0)
        table = sample_durations(model, builtin_hint("gpipe", p, v, m, placement=placement).shape, seed=7)
        for name, hint in applicable_builtins(p, v, m, table.microbatch_costs, placement=placement).items():
            for policy in ("fixed", "ready"):
                result = simulate(hint, table, policy)
                golden[f"{workload} {_key(p, v, m, placement)} {name} {policy}"] = {
                    "makespan": result.makespan, "bubble_fraction": result.bubble_fraction}
    return golden


if __name__ == "__main__":
    (HERE / "builtin_orders.json").write_text(json.dumps(builtin_orders(), indent=1) + "\n")
    (HERE / "sim_makespans.json").write_text(json.dumps(sim_makespans(), indent=1) + "\n")
    print("wrote", HERE / "builtin_orders.json", HERE / "sim_makespans.json")
