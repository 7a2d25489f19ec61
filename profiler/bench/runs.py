"""``rrfp bench``'s real runs: ``rrfp run`` jobs on this machine, and torch's schedules as external systems.

Real runs (:func:`run_real`): for each entry of :data:`REAL_SETS` (or
:data:`QUICK_REAL_SETS`) one launch through :func:`runtime.run.launch.launch`
runs every job of :data:`REAL_ROWS`, repetitions interleaved (job A, B, C,
then A, B, C again), so the compared jobs share the processes and the
machine's load. Every job of one set uses the same seed, so in each
iteration every job faces the same sampled durations (emulated) or data
(gpt). Iteration 0 of each job is a warm-up and is dropped; figures are the
median over repetitions x measured iterations of the step time (rank 0's
``wall_seconds``: tasks, optimizer, the closing all-gather), with min..max,
and speedups paired by (repetition, iteration).

The emulated sets draw their durations from the workload presets
(:attr:`RealSet.emulate`: ``vlm-mixed``, and ``sft-chat`` in the full run;
the gpt sets are the real language model), and the zb jobs' split backward
sleeps the preset's measured ``(I + W) / B`` ([Note: split backward cost by
preset] in :mod:`runtime.durations.presets`). ``fixed-1f1b-blocking`` is the
Megatron-style baseline: fixed 1F1B whose sends and receives block
(``RunConfig.p2p = "blocking"``).

External systems (:func:`run_external`): :mod:`profiler.bench.external`
(torch.distributed.pipelining's schedules against ``rrfp run`` on the same
stage modules and data; ``benchmarks/cross_framework.py`` runs it as a
script) as a subprocess, ``python -m profiler.bench.external``: it is part of
the installed package, so an installed ``rrfp bench`` runs it too. Its rows are read from the file its
``--json FILE`` writes (:func:`read_cross_framework`); its Markdown output is
kept beside the results for people. Two views are made of them
(:func:`external_measurements`, :func:`external_pairs`): the paper's
comparison (rrfp ready with the ``bf`` hint against torch's 1F1B and the
fastest torch schedule) and each torch schedule against the rrfp hint of
the same structure, fixed and ready, at that schedule's own memory
([Note: equal memory pairs] in :mod:`profiler.bench.external`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hints.outputs import Outputs
from profiler.bench.matrix import MICROBATCHES_PER_RANK
from profiler.bench.results import Suite, save, spread


@dataclass(frozen=True)
class RealRow:
    name: str
    hint: str
    policy: str  # "fixed" or "ready" (the default rule, lookahead)
    budget: str = "1f1b"  # ready only
    p2p: str = "async"  # fixed only: "blocking" is the Megatron-style baseline (RunConfig.p2p)


REAL_ROWS: tuple[RealRow, ...] = (
    RealRow("fixed-1f1b", "1f1b", "fixed"),
    RealRow("fixed-1f1b-blocking", "1f1b", "fixed", p2p="blocking"),
    RealRow("ready-1f1b@1f1b", "1f1b", "ready", "1f1b"),
    RealRow("ready-1f1b@2x", "1f1b", "ready", "2x"),
    RealRow("fixed-zb", "zb", "fixed"),
    RealRow("ready-zb@1f1b", "zb", "ready", "1f1b"),
    RealRow("ready-zb@2x", "zb", "ready", "2x"),
)


@dataclass(frozen=True)
class RealSet:
    """One launch: a workload at a rank count, every REAL_ROWS job ``repetitions`` times, interleaved."""

    workload: str  # "emulated" or "gpt"
    ranks: int
    microbatches: int
    iters: int  # per job, the first a warm-up
    repetitions: int
    forward_time: float = 0.010  # emulated: seconds per rank's forward
    emulate: str | None = None  # emulated: the duration model (RunConfig.emulate), a workload preset

    @property
    def label(self) -> str:
        return self.emulate if self.workload == "emulated" else self.workload


REAL_SETS: tuple[RealSet, ...] = (
    RealSet("emulated", 4, 4 * MICROBATCHES_PER_RANK, 4, 3, emulate="vlm-mixed"),
    RealSet("emulated", 8, 8 * MICROBATCHES_PER_RANK, 4, 2, emulate="vlm-mixed"),
    RealSet("emulated", 4, 4 * MICROBATCHES_PER_RANK, 4, 3, emulate="sft-chat"),
    RealSet("gpt", 2, 8, 5, 3),
    RealSet("gpt", 4, 16, 5, 3),
)
QUICK_REAL_SETS: tuple[RealSet, ...] = (
    RealSet("emulated", 4, 8, 3, 2, forward_time=0.005, emulate="vlm-mixed"),
    RealSet("gpt", 2, 4, 3, 2),
)

# cross_framework.py's arguments: the paper's external comparison uses the bf hint; every torch schedule,
# zero-bubble ones included, runs beside the rrfp hint of its structure at its memory ([Note: equal memory
# pairs] there). The quick run keeps torch's 1F1B, GPipe and one zero-bubble schedule (ZB1P, 2 chunks).
TORCH_SCHEDULES = ["Schedule1F1B", "ScheduleGPipe", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
                   "ScheduleZBVZeroBubble", "ScheduleDualPipeV"]
EXTERNAL_ARGS = ["--cases", "gpt", "multimodal", "--stages", "4", "--microbatches", "16", "--iters", "4",
                 "--schedules", *TORCH_SCHEDULES, "--hints", "1f1b", "bf", "--budgets", "1f1b", "2x"]
QUICK_EXTERNAL_ARGS = ["--cases", "multimodal", "--stages", "2", "--microbatches", "4", "--iters", "2",
                       "--warmup", "1", "--schedules", "Schedule1F1B", "ScheduleGPipe",
                       "ScheduleInterleavedZeroBubble", "--hints", "bf",
                       "--budgets", "1f1b"]


def real_sets(settings) -> tuple[RealSet, ...]:
    return QUICK_REAL_SETS if settings.quick else REAL_SETS


def units(settings) -> int:
    """Progress units of the real part: one per launch, one for the external script."""
    return (len(real_sets(settings)) if settings.real else 0) + (1 if settings.external else 0)


def _jobs(real: RealSet, settings, root: Path):
    from runtime.config import RunConfig
    from runtime.run.worker import Job

    base = dict(workload=real.workload, ranks=real.ranks, microbatches=real.microbatches, iters=real.iters,
                seed=settings.seed, trace=False)
    if real.workload == "emulated":
        base.update(emulate=real.emulate, forward_time=real.forward_time, jitter=settings.jitter,
                    split_overhead=settings.split_overhead)  # None: the preset's own
    jobs = []
    for repetition in range(real.repetitions):
        for row in REAL_ROWS:
            config = RunConfig(**base, hint=row.hint, policy=row.policy, p2p=row.p2p,
                               memory_budget=row.budget if row.policy == "ready" else "1f1b")
            name = f"{row.name}.{repetition}"
            jobs.append((row, repetition, Job(name, config, str(root / name))))
    return jobs


def run_real(suite: Suite, progress, done: int) -> int:
    """Every real set, one launch each; results saved after each launch."""
    from runtime.run.launch import RunFailed, launch
    from runtime.run.worker import WorkerOptions

    real = suite.results.setdefault("real", {"sets": [], "rows": [asdict_row(r) for r in REAL_ROWS]})
    if suite.settings.quick:
        suite.note("quick: real runs are tiny (emulated vlm-mixed 4 ranks x 8 microbatches, gpt 2 ranks x 4 "
                   "microbatches, 2 repetitions of 3 iterations, the first a warm-up); the full run has vlm-mixed "
                   "at 4 and 8 ranks, sft-chat at 4, gpt at 2 and 4")
    for real_set in real_sets(suite.settings):
        label = f"{real_set.label}, {real_set.ranks} ranks x {real_set.microbatches} microbatches"
        progress(done, f"real: {label} ({len(REAL_ROWS) * real_set.repetitions} jobs, one launch)")
        root = suite.out / "runs" / f"{real_set.label}-p{real_set.ranks}"
        jobs = _jobs(real_set, suite.settings, root)
        options = WorkerOptions(out_root=str(root), show_progress=False, timeout=120.0, threads=1)
        try:
            results = launch([job for _, _, job in jobs], options, real_set.ranks)[0]
        except RunFailed as err:
            suite.note(f"real {label}: the launch failed: {err}")
            real["sets"].append({**real_set.__dict__, "failed": str(err)})
            done += 1
            save(suite)
            continue
        real["sets"].append(summarize_real(real_set, jobs, results))
        done += 1
        save(suite)
    return done


def asdict_row(row: RealRow) -> dict:
    return dict(row.__dict__)


def summarize_real(real_set: RealSet, jobs, results: dict) -> dict:
    """Per row: step times (warm-up dropped) over repetitions, speedups paired by (repetition, iteration)."""
    walls: dict[str, dict[tuple[int, int], float]] = {}
    peaks: dict[str, int] = {}
    for row, repetition, job in jobs:
        for metric in results[job.name]["metrics"][1:]:
            walls.setdefault(row.name, {})[(repetition, metric["iteration"])] = metric["wall_seconds"]
            peaks[row.name] = max(peaks.get(row.name, 0), max(metric["peak_in_flight"]))
    base = walls["fixed-1f1b"]
    rows = []
    for row in REAL_ROWS:
        mine = walls[row.name]
        entry = {"row": row.name, "hint": row.hint, "policy": row.policy, "p2p": row.p2p,
                 "budget": row.budget if row.policy == "ready" else None,
                 "step_s": spread(list(mine.values())),
                 "speedup_vs_fixed_1f1b": spread([base[k] / mine[k] for k in mine if k in base and mine[k] > 0]),
                 "peak_in_flight": peaks[row.name]}
        if row.policy == "ready":
            fixed = walls.get(f"fixed-{row.hint}")
            if fixed is not None:
                entry["ready_over_fixed_same_hint"] = spread([fixed[k] / mine[k] for k in mine if k in fixed])
                entry["fixed_same_hint_peak_in_flight"] = peaks[f"fixed-{row.hint}"]
        rows.append(entry)
    return {**real_set.__dict__, "measured_iterations_per_job": real_set.iters - 1, "rows": rows}


# -- external systems ------------------------------------------------------------------------------


def run_external(suite: Suite, progress, done: int) -> int:
    """:mod:`profiler.bench.external` as a subprocess; its figures parsed into ``results["external"]``."""
    args = QUICK_EXTERNAL_ARGS if suite.settings.quick else EXTERNAL_ARGS
    args = [*args, "--seed", str(suite.settings.seed)]
    progress(done, f"external: cross_framework.py {' '.join(args)}")
    external = suite.results.setdefault("external", {})
    external.update(command=f"python benchmarks/cross_framework.py {' '.join(args)}")
    outcome = call_cross_framework(args, suite.out)
    external.update(outcome)
    if outcome.get("returncode") != 0:
        suite.note(f"external systems: cross_framework.py exited with {outcome.get('returncode')}; "
                   f"its output is in {outcome.get('stdout_file')}")
    save(suite)
    return done + 1


def call_cross_framework(args: list[str], out: Path) -> dict:
    """[The one place that runs the comparison.] ``python -m profiler.bench.external`` with ``--json FILE``
    (the package, wherever it is installed: no checkout needed); keep its Markdown and read its rows."""
    package_root = Path(__file__).resolve().parents[2]  # the folder holding profiler/ (a checkout or site-packages)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")])))
    folder = out / "external"
    with Outputs() as made:  # a refused directory is one line ([Note: outputs written whole] in hints.outputs)
        made.directory(folder)
    json_file = folder / "cross_framework.json"
    json_file.unlink(missing_ok=True)  # a file left by an earlier run is not this run's
    process = subprocess.Popen([sys.executable, "-m", "profiler.bench.external", *args, "--json", str(json_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = process.communicate()
    except KeyboardInterrupt:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    stdout_file = folder / "cross_framework.md"
    with Outputs() as outputs:  # the script's Markdown and its stderr, both or neither
        outputs.write_text(stdout_file, stdout)
        outputs.write_text(folder / "cross_framework.stderr", stderr)
    rows = read_cross_framework(json_file)
    result = {"returncode": process.returncode, "stdout_file": str(stdout_file.relative_to(out)),
              "json_file": str(json_file.relative_to(out)) if json_file.is_file() else None, "rows": rows}
    result["measurements"] = external_measurements(rows)
    result["pairs"] = external_pairs(rows)
    return result


def read_cross_framework(json_file: Path) -> list[dict]:
    """The rows cross_framework.py's ``--json`` wrote (its ``json_row`` fields); none if it wrote nothing
    (it rewrites the file after every case, so a failed run leaves the cases that finished)."""
    try:
        rows = json.loads(json_file.read_text())
    except (OSError, ValueError):
        return []
    return rows if isinstance(rows, list) else []


def external_measurements(rows: list[dict]) -> list[dict]:
    """Per case and budget: rrfp's ready bf against torch's Schedule1F1B and against the fastest torch schedule."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        torch_rows = [r for r in mine if r["system"] == "torch"]
        one_f_one_b = next((r for r in torch_rows if r["schedule"] == "Schedule1F1B"), None)
        fastest = min(torch_rows, key=lambda r: r["median_step_s"], default=None)
        for row in mine:
            if row["system"] != "rrfp" or row["policy"] != "ready" or row["schedule"] != "bf" or row["chunks"] != 1:
                continue
            out.append({"case": case, "budget": row["budget"], "rrfp_step_s": row["median_step_s"],
                        "rrfp_peak_in_flight": row["peak_in_flight"],
                        "vs_torch_1f1b": one_f_one_b and one_f_one_b["median_step_s"] / row["median_step_s"],
                        "fastest_torch": fastest and fastest["schedule"],
                        "fastest_torch_peak_in_flight": fastest and fastest["peak_in_flight"],
                        "vs_fastest_torch": fastest and fastest["median_step_s"] / row["median_step_s"]})
    return out


def external_pairs(rows: list[dict]) -> list[dict]:
    """Per case and torch schedule: the rrfp hint of the same structure in fixed order and ready at the
    schedule's own peak ([Note: equal memory pairs] in :mod:`profiler.bench.external`); ``equal_memory`` false when that
    peak is no rrfp budget and ready ran at its maximum (marked ``*``)."""
    out = []
    for torch_row in (r for r in rows if r["system"] == "torch"):
        paired = [r for r in rows if r["system"] == "rrfp" and r["case"] == torch_row["case"]
                  and r.get("paired_with") == torch_row["schedule"]]
        fixed = next((r for r in paired if r["policy"] == "fixed"), None)
        ready = next((r for r in paired if r["policy"] == "ready"), None)
        torch_step = torch_row["median_step_s"]
        out.append({
            "case": torch_row["case"], "torch_schedule": torch_row["schedule"],
            "hint": (fixed or ready or {}).get("schedule"), "chunks": torch_row["chunks"],
            "placement": torch_row["placement"], "torch_step_s": torch_step,
            "torch_peak_in_flight": torch_row["peak_in_flight"],
            "fixed_step_s": fixed and fixed["median_step_s"], "ready_step_s": ready and ready["median_step_s"],
            "ready_budget": ready and ready["budget"], "ready_peak_in_flight": ready and ready["peak_in_flight"],
            "equal_memory": ready["equal_memory"] if ready else None,
            "fixed_vs_torch": fixed and torch_step / fixed["median_step_s"],
            "ready_vs_torch": ready and torch_step / ready["median_step_s"],
            "ready_over_fixed": ready and fixed and fixed["median_step_s"] / ready["median_step_s"],
        })
    return out


__all__ = ["EXTERNAL_ARGS", "QUICK_REAL_SETS", "REAL_ROWS", "REAL_SETS", "RealRow", "RealSet", "TORCH_SCHEDULES",
           "call_cross_framework", "external_measurements", "external_pairs", "read_cross_framework", "run_external",
           "run_real", "units"]
