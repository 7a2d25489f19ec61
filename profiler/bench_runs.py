"""``rrfp bench``'s real runs: ``rrfp run`` jobs on this machine, and torch's schedules as external systems.

Real runs (:func:`run_real`): for each entry of :data:`REAL_SETS` (or
:data:`QUICK_REAL_SETS`) one launch through :func:`runtime.launch.launch`
runs every job of :data:`REAL_ROWS`, repetitions interleaved (job A, B, C,
then A, B, C again), so the compared jobs share the processes and the
machine's load. Every job of one set uses the same seed, so in each
iteration every job faces the same sampled durations (emulated) or data
(gpt). Iteration 0 of each job is a warm-up and is dropped; figures are the
median over repetitions x measured iterations of the step time (rank 0's
``wall_seconds``: tasks, optimizer, the closing all-gather), with min..max,
and speedups paired by (repetition, iteration).

External systems (:func:`run_external`): ``benchmarks/cross_framework.py``
(torch.distributed.pipelining's ``Schedule1F1B`` and ``ScheduleGPipe``
against ``rrfp run`` on the same stage modules and data) as a subprocess.
It is a script of the repository, not part of the installed packages, so an
installed ``rrfp`` without the checkout skips it with a note. Its output is
parsed in :func:`parse_cross_framework` (the Markdown tables it prints
today); when the script offers ``--json FILE`` the file is passed and kept
raw in the results. Adapting to the JSON is one function
(:func:`external_measurements`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from profiler.bench import MICROBATCHES_PER_RANK, Suite, save, spread

REAL_EMULATE = "multimodal"  # the emulated runs' duration model (RunConfig.emulate); a preset name once they land


@dataclass(frozen=True)
class RealRow:
    name: str
    hint: str
    policy: str  # "fixed" or "ready" (the default rule, lookahead)
    budget: str = "1f1b"  # ready only


REAL_ROWS: tuple[RealRow, ...] = (
    RealRow("fixed-1f1b", "1f1b", "fixed"),
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


REAL_SETS: tuple[RealSet, ...] = (
    RealSet("emulated", 4, 4 * MICROBATCHES_PER_RANK, 4, 3),
    RealSet("emulated", 8, 8 * MICROBATCHES_PER_RANK, 4, 2),
    RealSet("gpt", 2, 8, 5, 3),
    RealSet("gpt", 4, 16, 5, 3),
)
QUICK_REAL_SETS: tuple[RealSet, ...] = (
    RealSet("emulated", 4, 8, 3, 2, forward_time=0.005),
    RealSet("gpt", 2, 4, 3, 2),
)

# cross_framework.py's arguments: the paper's external comparison uses the bf hint.
EXTERNAL_ARGS = ["--cases", "gpt", "multimodal", "--stages", "4", "--microbatches", "16", "--iters", "4",
                 "--hints", "1f1b", "bf", "--budgets", "1f1b", "2x"]
QUICK_EXTERNAL_ARGS = ["--cases", "multimodal", "--stages", "2", "--microbatches", "4", "--iters", "2",
                       "--warmup", "1", "--hints", "bf", "--budgets", "1f1b"]


def real_sets(settings) -> tuple[RealSet, ...]:
    return QUICK_REAL_SETS if settings.quick else REAL_SETS


def units(settings) -> int:
    """Progress units of the real part: one per launch, one for the external script."""
    return (len(real_sets(settings)) if settings.real else 0) + (1 if settings.external else 0)


def _jobs(real: RealSet, settings, root: Path):
    from runtime.config import RunConfig
    from runtime.worker import Job

    base = dict(workload=real.workload, stages=real.ranks, microbatches=real.microbatches, iters=real.iters,
                seed=settings.seed, trace=False)
    if real.workload == "emulated":
        base.update(emulate=REAL_EMULATE, forward_time=real.forward_time, jitter=settings.jitter)
    jobs = []
    for repetition in range(real.repetitions):
        for row in REAL_ROWS:
            config = RunConfig(**base, hint=row.hint, policy=row.policy,
                               memory_budget=row.budget if row.policy == "ready" else "1f1b")
            name = f"{row.name}.{repetition}"
            jobs.append((row, repetition, Job(name, config, str(root / name))))
    return jobs


def run_real(suite: Suite, progress, done: int) -> int:
    """Every real set, one launch each; results saved after each launch."""
    from runtime.launch import RunFailed, launch
    from runtime.worker import WorkerOptions

    real = suite.results.setdefault("real", {"sets": [], "rows": [asdict_row(r) for r in REAL_ROWS]})
    if suite.settings.quick:
        suite.note("quick: real runs are tiny (emulated 4 ranks x 8 microbatches, gpt 2 ranks x 4 microbatches, "
                   "2 repetitions of 3 iterations, the first a warm-up); the full run has 4/8 and 2/4 ranks")
    for real_set in real_sets(suite.settings):
        label = f"{real_set.workload}, {real_set.ranks} ranks x {real_set.microbatches} microbatches"
        progress(done, f"real: {label} ({len(REAL_ROWS) * real_set.repetitions} jobs, one launch)")
        root = suite.out / "runs" / f"{real_set.workload}-p{real_set.ranks}"
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
        entry = {"row": row.name, "hint": row.hint, "policy": row.policy,
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
    emulate = REAL_EMULATE if real_set.workload == "emulated" else None
    return {**real_set.__dict__, "emulate": emulate, "measured_iterations_per_job": real_set.iters - 1, "rows": rows}


# -- external systems ------------------------------------------------------------------------------


def cross_framework_script() -> Path | None:
    """``benchmarks/cross_framework.py`` of the checkout this package runs from, if there is one."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cross_framework.py"
    return script if script.is_file() else None


def run_external(suite: Suite, progress, done: int) -> int:
    """cross_framework.py as a subprocess; its figures parsed into ``results["external"]``."""
    script = cross_framework_script()
    if script is None:
        suite.note("external systems skipped: benchmarks/cross_framework.py is not beside this package "
                   "(run rrfp bench from a checkout)")
        return done
    args = QUICK_EXTERNAL_ARGS if suite.settings.quick else EXTERNAL_ARGS
    args = [*args, "--seed", str(suite.settings.seed)]
    progress(done, f"external: cross_framework.py {' '.join(args)}")
    external = suite.results.setdefault("external", {})
    external.update(command=f"python benchmarks/cross_framework.py {' '.join(args)}")
    outcome = call_cross_framework(script, args, suite.out)
    external.update(outcome)
    if outcome.get("returncode") != 0:
        suite.note(f"external systems: cross_framework.py exited with {outcome.get('returncode')}; "
                   f"its output is in {outcome.get('stdout_file')}")
    save(suite)
    return done + 1


def call_cross_framework(script: Path, args: list[str], out: Path) -> dict:
    """[The one place that calls the script.] Run it, keep its stdout, parse it (and its --json if offered)."""
    root = script.parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    help_text = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                               cwd=root, timeout=120).stdout
    json_file = None
    if "--json" in help_text:
        json_file = out / "external" / "cross_framework.json"
        json_file.parent.mkdir(parents=True, exist_ok=True)
        args = [*args, "--json", str(json_file)]
    process = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        stdout, stderr = process.communicate()
    except KeyboardInterrupt:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    (out / "external").mkdir(parents=True, exist_ok=True)
    stdout_file = out / "external" / "cross_framework.md"
    stdout_file.write_text(stdout)
    (out / "external" / "cross_framework.stderr").write_text(stderr)
    result = {"returncode": process.returncode, "stdout_file": str(stdout_file.relative_to(out)),
              "cases": parse_cross_framework(stdout)}
    if json_file is not None and json_file.is_file():
        import json

        result["json_output"] = json.loads(json_file.read_text())
    result["measurements"] = external_measurements(result)
    return result


_CASE = re.compile(r"^### (\w[\w-]*): (.*)$")
_MS = re.compile(r"([\d.,]+) ms")


def parse_cross_framework(text: str) -> dict:
    """The per-case tables of cross_framework.py's Markdown: case -> rows (runner, schedule, policy, budget,
    median/min/max step in seconds, peak in flight)."""
    cases: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        match = _CASE.match(line)
        if match and match.group(1) != "Summary":
            current = cases.setdefault(match.group(1), {"about": match.group(2), "rows": []})
            continue
        if current is None or not line.startswith("| ") or line.startswith("| runner") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 10 or cells[0] not in ("torch", "rrfp"):
            continue
        median = _MS.fullmatch(cells[4])
        low_high = re.fullmatch(r"([\d.,]+) - ([\d.,]+) ms", cells[5])
        if not median or not low_high:
            continue
        current["rows"].append({
            "runner": cells[0], "schedule": cells[1], "policy": cells[2], "budget": cells[3],
            "median_step_s": float(median.group(1).replace(",", "")) / 1e3,
            "min_step_s": float(low_high.group(1).replace(",", "")) / 1e3,
            "max_step_s": float(low_high.group(2).replace(",", "")) / 1e3,
            "peak_in_flight": cells[9]})
    return {name: case for name, case in cases.items() if case["rows"]}


def external_measurements(result: dict) -> list[dict]:
    """Per case and budget: rrfp's ready bf against torch's Schedule1F1B and against the fastest torch schedule.

    The one function to adapt when cross_framework.py's JSON (``result["json_output"]``) replaces the
    Markdown it prints today.
    """
    out = []
    for case, data in result.get("cases", {}).items():
        rows = data["rows"]
        torch_rows = [r for r in rows if r["runner"] == "torch"]
        one_f_one_b = next((r for r in torch_rows if r["schedule"] == "Schedule1F1B"), None)
        fastest = min(torch_rows, key=lambda r: r["median_step_s"], default=None)
        for row in rows:
            if row["runner"] != "rrfp" or row["policy"] != "ready" or row["schedule"] != "bf":
                continue
            out.append({"case": case, "budget": row["budget"], "rrfp_step_s": row["median_step_s"],
                        "rrfp_peak_in_flight": row["peak_in_flight"],
                        "vs_torch_1f1b": one_f_one_b and one_f_one_b["median_step_s"] / row["median_step_s"],
                        "fastest_torch": fastest and fastest["schedule"],
                        "fastest_torch_peak_in_flight": fastest and fastest["peak_in_flight"],
                        "vs_fastest_torch": fastest and fastest["median_step_s"] / row["median_step_s"]})
    return out


__all__ = ["QUICK_REAL_SETS", "REAL_ROWS", "REAL_SETS", "RealRow", "RealSet", "call_cross_framework",
           "external_measurements", "parse_cross_framework", "run_external", "run_real", "units"]
