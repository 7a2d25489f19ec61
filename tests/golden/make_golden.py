"""Regenerate the golden files: `python tests/golden/make_golden.py` (review the diff before committing).

builtin_orders.json: the text order of every built-in hint on a few shapes.
sim_makespans.json: fixed/ready makespans of every built-in on seeded workloads.
"""

from __future__ import annotations

import json
from pathlib import Path

from hints.orders import applicable_builtins, builtin_hint
from runtime.simulator import simulate
from runtime.variability import VariabilityModel, sample_durations

HERE = Path(__file__).parent
ORDER_SHAPES = [(4, 1, 8), (3, 1, 5), (4, 2, 8), (2, 3, 4)]
SIM_CASES = [
    ("multimodal", 4, 1, 8, 0.2, 0.001),
    ("language", 4, 2, 8, 0.1, 0.0),
    ("uniform", 3, 1, 6, 0.3, 0.002),
]


def builtin_orders() -> dict:
    golden = {}
    for p, v, m in ORDER_SHAPES:
        for name, hint in applicable_builtins(p, v, m).items():
            golden[f"{name} p={p} v={v} m={m}"] = [" ".join(o) for o in hint.text_orders()]
    return golden


def sim_makespans() -> dict:
    golden = {}
    for workload, p, v, m, jitter, latency in SIM_CASES:
        model = VariabilityModel(workload=workload, jitter=jitter, comm_latency=latency)
        table = sample_durations(model, builtin_hint("gpipe", p, v, m).shape, seed=7)
        for name, hint in applicable_builtins(p, v, m, table.microbatch_costs).items():
            for policy in ("fixed", "ready"):
                result = simulate(hint, table, policy)
                golden[f"{workload} p={p} v={v} m={m} {name} {policy}"] = {
                    "makespan": result.makespan, "bubble_fraction": result.bubble_fraction}
    return golden


if __name__ == "__main__":
    (HERE / "builtin_orders.json").write_text(json.dumps(builtin_orders(), indent=1) + "\n")
    (HERE / "sim_makespans.json").write_text(json.dumps(sim_makespans(), indent=1) + "\n")
    print("wrote", HERE / "builtin_orders.json", HERE / "sim_makespans.json")
