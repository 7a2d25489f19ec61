"""Run a list of jobs on real processes and save each rank's results (started by tests.helpers.jobs.run_jobs).

    python -m tests.helpers.runtime_harness SPEC.json RESULTS.pt

SPEC.json: {"nproc": 2, "timeout": 30, "jobs": [{"name": ..., "config": {RunConfig fields}}, ...]}; a job may
name a ``"recorder"`` ("profiler.trace.recorder:TraceRecorder" writes its traces under run/<name>/trace).
Running in a subprocess lets the test put a hard timeout on the whole launch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from runtime.config import RunConfig
from runtime.run.launch import launch
from runtime.run.worker import Job, WorkerOptions


def main(spec_path: str, results_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    root = Path(results_path).parent / "run"
    jobs = [Job(j["name"], RunConfig(**j["config"]), str(root / j["name"]), collect_grads=True,
                recorder=j.get("recorder")) for j in spec["jobs"]]
    results = launch(jobs, WorkerOptions(str(root), timeout=spec.get("timeout", 30.0)), spec["nproc"])
    torch.save(results, results_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
