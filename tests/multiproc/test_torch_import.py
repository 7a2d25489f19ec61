"""``rrfp trace import`` on real torch.distributed.pipelining jobs: examples/torch_pipelining_job.py profiled on
gloo (2 ranks, CPU) under each built-in schedule, imported, and checked against the profiler's own JSON."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hints.files.torch_csv import export_torch_csv, in_torch_loss_order
from hints.files.torch_import import import_torch_schedule
from hints.tasks import PipelineShape
from profiler.trace.reader import read_trace
from runtime.sched.simulator import check_completes
from tests.helpers.cli import child_env, run_cli
from tests.helpers.schedules import random_completing_hint

pytestmark = pytest.mark.multiproc

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "torch_pipelining_job.py"
SCHEDULES = {"1F1B": 1, "GPipe": 1, "Interleaved1F1B": 2, "InterleavedZeroBubble": 2, "ZBVZeroBubble": 2}


def run_job(cwd: Path, *args: str) -> list[float]:
    """The example job in a subprocess with a hard timeout; its losses."""
    env = {**child_env(), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(JOB), "-p", "2", "-m", "4", "--timeout", "30", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=150)
    # torch logs each failing rank's whole schedule: the errors first, so the rank that failed first is seen
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    assert done.returncode == 0, "\n".join(errors[:20]) + "\n...\n" + done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["losses"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Per schedule: (its trace folder, the job's losses)."""
    root = tmp_path_factory.mktemp("torch-jobs")
    out = {}
    for name in SCHEDULES:
        folder = root / name
        out[name] = (folder, run_job(root, "--schedule", name, "--profile-dir", str(folder), "--gzip"))
    return out


def _raw_compute(folder: Path) -> dict[int, dict[str, int]]:
    """Per rank, per ``PP:`` compute action (or GPipe's ``Forward i`` / ``Backward i``, named here as the task
    it is): its range's end minus its first operator's start, in ns: the profiler's compute slices with the
    input wait left out, read straight from the JSON."""
    out = {}
    for path in sorted(folder.glob("rank*_trace.json.gz")):
        data = json.loads(gzip.decompress(path.read_bytes()))
        rank = data["distributedInfo"]["rank"]
        events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
        actions = [e for e in events if e.get("cat") == "user_annotation" and (
            (e["name"].startswith("PP:") and e["name"][3:].rstrip("0123456789")[-1:] in "FBIW" and "_" not in e["name"])
            or e["name"].startswith(("Forward ", "Backward ")))]
        spans = {}
        for action in actions:
            lo, hi = action["ts"], action["ts"] + action["dur"]
            inner = [e["ts"] for e in events if e is not action and e["tid"] == action["tid"]
                     and lo <= e["ts"] and e["ts"] + e["dur"] <= hi
                     and not e["name"].startswith(("gloo:", "c10d::", "nccl:"))]
            step = max((e for e in events if e["name"].startswith("ProfilerStep#") and e["ts"] <= lo),
                       key=lambda e: e["ts"])["name"]
            name = action["name"]
            if not name.startswith("PP:"):  # GPipe: rank r runs stage r
                name = f"PP:{rank}{name[0]}{name.split()[1]}"
            spans[f"{step} {name}"] = round((hi - min(inner, default=lo)) * 1000)
        out[rank] = spans
    return out


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_imports_with_its_tasks(profiled, tmp_path, name):
    folder, _ = profiled[name]
    result = run_cli(tmp_path, "trace", "import", str(folder), "--out", "run", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    shape = import_torch_schedule(name, 2, 4, SCHEDULES[name]).shape
    assert data["schedule"] == name
    assert data["complete_iterations"] == [1, 2]
    frames = read_trace(tmp_path / "run")
    assert frames.tasks.height == 2 * shape.total_tasks
    assert frames.transfers.height > 0
    for command in ("bubbles", "critical-path", "sensitivity"):
        assert run_cli(tmp_path, "trace", command, "run").returncode == 0, command


@pytest.mark.parametrize("name", ["GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"])
def test_imported_durations_are_the_profilers_compute_slices(profiled, tmp_path, name):
    """Acceptance: busy time per rank within 1% of the profiler's compute slices, and each task exactly."""
    folder, _ = profiled[name]
    assert run_cli(tmp_path, "trace", "import", str(folder), "--out", "run").returncode == 0
    raw = _raw_compute(folder)
    tasks = read_trace(tmp_path / "run").tasks
    for rank, spans in raw.items():
        mine = {f"ProfilerStep#{r['iteration']} PP:{r['task']}": r["duration_ns"]
                for r in tasks.filter(tasks["rank"] == rank).iter_rows(named=True)}
        assert mine.keys() == spans.keys()
        assert all(abs(mine[key] - spans[key]) <= 2 for key in spans)  # each end rounded to the ns on its own
    bubbles = json.loads(run_cli(tmp_path, "trace", "bubbles", "run", "--iterations", "1:", "--json").stdout)
    busy = {row["rank"]: row["busy_ns"] for row in bubbles["rows"]}
    for rank, spans in raw.items():
        assert busy[str(rank)] == pytest.approx(sum(spans.values()), rel=0.01)


def test_unannotated_1f1b_is_cut_into_its_tasks(profiled, tmp_path):
    """Schedule1F1B records no names ([Note: tasks without annotations]): forwards precede their backwards, each
    microbatch once per rank, in index order."""
    folder, _ = profiled["1F1B"]
    assert run_cli(tmp_path, "trace", "import", str(folder), "--out", "run").returncode == 0
    tasks = read_trace(tmp_path / "run").tasks
    for (rank, iteration), group in tasks.group_by(["rank", "iteration"]):
        order = group.sort("start_ns").get_column("task").to_list()
        assert sorted(order) == sorted(f"{rank}{k}{mb}" for k in "FB" for mb in range(4))
        for mb in range(4):
            assert order.index(f"{rank}F{mb}") < order.index(f"{rank}B{mb}")
    assert (tasks.get_column("duration_ns") > 0).all()


def test_the_schedules_compute_the_same_losses(profiled):
    losses = {name: loss for name, (_, loss) in profiled.items()}
    reference = losses["Interleaved1F1B"]
    assert losses["ZBVZeroBubble"] == pytest.approx(reference, rel=1e-6)
    assert losses["InterleavedZeroBubble"] == pytest.approx(reference, rel=1e-6)
    assert losses["1F1B"] == pytest.approx(losses["GPipe"], rel=1e-6)
    assert os.path.isfile(JOB)


def test_round_trip_trace_to_tuned_csv_to_torch_runs_with_the_same_loss(profiled, tmp_path):
    """A torch job's trace -> rrfp trace import -> rrfp tune-hint --target torch -> the CSV loaded by torch's
    _PipelineScheduleRuntime._load_csv: the job runs the tuned order and computes the same losses."""
    folder, losses = profiled["Interleaved1F1B"]
    assert run_cli(tmp_path, "trace", "import", str(folder), "--out", "run").returncode == 0
    tuned = run_cli(tmp_path, "tune-hint", "run", "--target", "torch", "--policy", "fixed", "--out", "tuned",
                    "--time-budget", "5s")
    assert tuned.returncode == 0, tuned.stderr
    csv_path = tmp_path / "tuned" / "schedule.csv"
    assert "_load_csv" in (tmp_path / "tuned" / "torch_schedule.md").read_text()
    assert run_job(tmp_path, "--csv", str(csv_path)) == pytest.approx(losses, rel=1e-6)


def test_an_order_whose_last_stage_runs_forwards_out_of_turn_runs_in_torch_renamed(profiled, tmp_path):
    """1F1B heaviest first, bound to one iteration's costs, runs the last stage's forwards out of microbatch order:
    exported as it was, torch failed mid-step ("Loss for microbatch 3 is not available") or, for other orders,
    trained on the wrong losses. Exported now with its microbatches renamed ([Note: torch's loss order] in
    hints/files/torch_csv.py), it computes the losses every schedule of this job computes."""
    _, losses = profiled["Interleaved1F1B"]
    result = run_cli(tmp_path, "hints", "export", "1f1b-heavy", "-p", "2", "-v", "2", "-m", "4", "--workload",
                     "vlm-mixed", "--freeze-iteration", "0", "--torch-csv", "s.csv", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["renamed_microbatches"] not in (None, [0, 1, 2, 3])
    assert run_job(tmp_path, "--csv", str(tmp_path / "s.csv")) == pytest.approx(losses, rel=1e-6)


@pytest.mark.parametrize("shape, seed", [(PipelineShape(2, 2, 4, True), 3), (PipelineShape(2, 2, 4, placement="v"), 8)],
                         ids=["looping-split", "v"])
def test_a_random_order_the_export_accepts_runs_right_in_torch(profiled, tmp_path, shape, seed):
    """Any order that completes, renamed and exported, trains as torch's own schedules do: random list-schedule
    orders found the loss order ([Note: torch's loss order]); these two keep asking."""
    _, losses = profiled["Interleaved1F1B"]
    hint, renamed = in_torch_loss_order(random_completing_hint(shape, seed))
    assert renamed is not None  # the seed draws an order torch would have run wrong as it was
    assert export_torch_csv(hint, tmp_path / "s.csv", check_completes) is not None
    assert run_job(tmp_path, "--csv", str(tmp_path / "s.csv")) == pytest.approx(losses, rel=1e-6)
