"""A rank that fails before its process group exists ends the run within seconds, named (issue 24; [Note: bootstrap
waits where signals land] in runtime/run/worker.py). Real ranks (3, emulated workload) in the warm runner. The
other remaining fault paths (reports, logs and checkpoints on a full disk): tests/inproc/test_run_faults_more.py.
"""

from __future__ import annotations

import json
import time

from tests.helpers.warm import run_jobs_warm

JOB = {"name": "j", "config": {"workload": "emulated", "ranks": 3, "microbatches": 3, "iters": 3,
                               "forward_time": 0.001, "trace": False}}


def test_a_rank_failing_before_its_process_group_ends_the_run_within_seconds_named(tmp_path):
    # rank 1 cannot make its status file, before init_process_group: ranks 0 and 2 wait there for it
    (tmp_path / "run" / "status" / "rank1").mkdir(parents=True)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"nproc": 3, "timeout": 30, "jobs": [JOB]}))
    began = time.monotonic()
    done = run_jobs_warm(spec, tmp_path / "results.pt", timeout=120)
    took = time.monotonic() - began
    assert done.returncode == 1, done.stderr[-3000:]
    message = done.stderr[done.stderr.index("RunFailed: "):]
    assert message.startswith(f"RunFailed: rank 1 failed: IsADirectoryError: [Errno 21] Is a directory: "
                              f"'{tmp_path}/run/status/rank1'\nranks 0, 2 were stopped\n"), message
    assert took < 10, f"the run took {took:.1f} s to end after rank 1 failed at its start"
