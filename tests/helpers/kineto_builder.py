"""Synthetic torch profiler (Kineto Chrome-JSON) traces of a pipeline schedule, for the importer's unit tests.

Each rank runs its order back to back: task ``k`` of a rank opens its ``PP:<task>`` range at ``t``, waits
``wait_us`` (no operator), computes ``compute_us`` (one ``aten::mm`` operator) and closes; a message leaves as
a ``PP:<s>SEND_<F|B><mb>`` range with a ``gloo:send`` range, and arrives as a ``RECV`` range with a
``gloo:recv`` range. On ``cuda`` each compute range has a ``gpu_user_annotation`` twin offset by
``gpu_lag_us``. Times are in microseconds, as Kineto writes them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from hints.orders import HintOrder
from hints.tasks import Task


def kineto_traces(hint: HintOrder, folder: Path, steps=(1, 2), compute_us: float = 100.0, wait_us: float = 10.0,
                  cuda: bool = False, gpu_lag_us: float = 5.0, world: int | None = None, gz: bool = False,
                  step_offset_us: dict[int, float] | None = None, names: str = "pp") -> dict[int, Path]:
    """Write ``rank{r}_trace.json`` per rank; returns the paths. ``names``: ``pp`` (PP: actions) or ``gpipe``
    (``Forward i`` / ``Backward i``)."""
    shape = hint.shape
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for rank, order in enumerate(hint.orders):
        events = [{"ph": "M", "name": "process_name", "pid": 100 + rank, "tid": 0, "args": {"name": "python"}}]
        t = 1_000_000.0 + (step_offset_us or {}).get(rank, 0.0)
        for number in steps:
            step_start = t
            t += 5.0
            body = []
            for text in order:
                task = Task.parse(str(text))
                name = f"PP:{task}" if names == "pp" else f"{'Forward' if task.kind.value == 'F' else 'Backward'} " \
                    f"{task.microbatch}"
                if names == "pp" and _receives(shape, task):
                    kind, mb = ("F", task.microbatch) if task.kind.value == "F" else ("B", task.microbatch)
                    body.append(_x(f"PP:{task.stage}RECV_{kind}{mb}", t, 3.0, rank))
                    body.append(_x("gloo:recv", t + 1.0, 2.0 + wait_us, rank))
                    t += 4.0
                body.append(_x(name, t, wait_us + compute_us, rank))
                body.append(_x("aten::mm", t + wait_us, compute_us, rank, "cpu_op"))
                if task.kind.value == "F":
                    body.append({"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": len(body), "pid": 100 + rank,
                                 "tid": 100 + rank, "ts": t + wait_us})
                if cuda:
                    body.append(_x(name, t + wait_us + gpu_lag_us, compute_us, 0, "gpu_user_annotation", tid=7))
                t += wait_us + compute_us + 1.0
                if names == "pp" and _sends(shape, task):
                    kind = "F" if task.kind.value == "F" else "B"
                    body.append(_x(f"PP:{task.stage}SEND_{kind}{task.microbatch}", t, 3.0, rank))
                    body.append(_x("gloo:send", t + 1.0, 20.0, rank))
                    t += 4.0
            events.append(_x(f"ProfilerStep#{number}", step_start, t - step_start + 5.0, rank))
            events += body
            t += 50.0
        data = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank,
                                                        "world_size": world or shape.ranks},
                "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}
        path = folder / f"rank{rank}_trace.json{'.gz' if gz else ''}"
        raw = json.dumps(data).encode()
        path.write_bytes(gzip.compress(raw) if gz else raw)
        paths[rank] = path
    return paths


def _x(name, ts, dur, rank, cat="user_annotation", tid=None) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100 + rank, "tid": 100 + rank if tid is None else tid,
            "ts": ts, "dur": dur}


def _receives(shape, task: Task) -> bool:
    """Whether the task's input comes from another rank."""
    if task.kind.value == "F":
        return task.stage > 0 and shape.rank_of(task.stage - 1) != shape.rank_of(task.stage)
    if task.kind.value == "W":
        return False
    return task.stage < shape.stages - 1 and shape.rank_of(task.stage + 1) != shape.rank_of(task.stage)


def _sends(shape, task: Task) -> bool:
    if task.kind.value == "F":
        return task.stage < shape.stages - 1 and shape.rank_of(task.stage + 1) != shape.rank_of(task.stage)
    if task.kind.value == "W":
        return False
    return task.stage > 0 and shape.rank_of(task.stage - 1) != shape.rank_of(task.stage)
