"""A job's outputs as it goes: inputs before the first iteration, one metrics row per iteration, parquet at the end.

* :func:`write_job_inputs`: ``config.json`` (and an emulated job's ``durations.parquet``) before the first
  iteration, so a run that fails keeps what it was.
* :func:`gather_summaries`: every rank's iteration summary (the all-gather that is also the barrier between
  iterations); :func:`metrics_row` turns them into one row.
* :class:`MetricsLog`: rank 0 appends each row to ``metrics.jsonl`` as the iteration ends and turns the log
  into ``metrics.parquet`` at the end; :func:`salvage_metrics` does the same after a failure or an interrupt
  (the launcher, ``rrfp run``).

Every file is written through :mod:`hints.outputs` ([Note: outputs written whole]): a full disk is a
:class:`hints.outputs.DiskError` naming the file and the file system, and the lines of ``metrics.jsonl`` already
written stay (a log that cannot become ``metrics.parquet`` is kept as it is).

Per-rank lists in a row are indexed by global rank (:class:`runtime.comm.grid.ProcessGrid`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hints.outputs import write_error, write_text, write_whole


def gather_summaries(world: int, result, group, clock_offset_ns: int = 0, reduced=None) -> list[dict[str, Any]]:
    """Every rank's iteration summary (tensor collectives: the object ones need numpy); start and end on
    rank 0's clock. ``reduced``: this rank's data-parallel reduction (:class:`runtime.run.dp.ReduceStats`)."""
    import torch
    import torch.distributed as dist

    counts = torch.tensor([result.start_ns + clock_offset_ns, result.end_ns + clock_offset_ns, result.busy_ns,
                           result.units, result.peak_in_flight, reduced.reduce_ns if reduced else 0,
                           reduced.exposed_ns if reduced else 0], dtype=torch.int64)
    loss = torch.tensor([float("nan") if result.loss is None else result.loss], dtype=torch.float64)
    all_counts = [torch.empty_like(counts) for _ in range(world)]
    all_losses = [torch.empty_like(loss) for _ in range(world)]
    dist.all_gather(all_counts, counts, group=group)
    dist.all_gather(all_losses, loss, group=group)
    summaries = []
    for rank, (c, l) in enumerate(zip(all_counts, all_losses)):
        start_ns, end_ns, busy_ns, units, peak, reduce_ns, exposed_ns = c.tolist()
        value = l.item()
        summaries.append({"rank": rank, "start_ns": start_ns, "end_ns": end_ns, "busy_ns": busy_ns, "units": units,
                          "peak_in_flight": peak, "loss": None if value != value else value,
                          "reduce_ns": reduce_ns, "exposed_ns": exposed_ns})
    return summaries


def metrics_row(iteration: int, gathered: list[dict], wall: float, unit: str,
                 with_reduce: bool = False) -> dict[str, Any]:
    """One line of ``metrics.jsonl``; per-rank lists are indexed by global rank. The loss is the mean over
    the data-parallel replicas (one last-stage leader each: the loss of the whole batch)."""
    start = min(g["start_ns"] for g in gathered)
    end = max(g["end_ns"] for g in gathered)
    makespan = max(end - start, 1) * 1e-9
    losses = [g["loss"] for g in gathered if g["loss"] is not None]
    loss = sum(losses) / len(losses) if losses else None
    units = sum(g["units"] for g in gathered)
    reduce = {"dp_reduce_seconds": [g["reduce_ns"] * 1e-9 for g in gathered],
              "dp_exposed_seconds": [g["exposed_ns"] * 1e-9 for g in gathered]} if with_reduce else {}
    return {
        "iteration": iteration,
        "loss": loss,
        "wall_seconds": wall,
        "makespan_seconds": makespan,
        "throughput": units / wall if wall > 0 else 0.0,
        "unit": f"{unit}/s",
        "busy_seconds": [g["busy_ns"] * 1e-9 for g in gathered],
        "idle_fraction": [max(0.0, 1.0 - g["busy_ns"] * 1e-9 / makespan) for g in gathered],
        "peak_in_flight": [g["peak_in_flight"] for g in gathered],
        **reduce,
    }


def write_job_inputs(out_dir: Path, config, workload) -> None:
    """Before the first iteration: ``config.json`` and, for the emulated workload, every iteration's sampled
    durations (known up front), so a run that fails keeps what it was."""
    write_text(out_dir / "config.json", json.dumps(config.to_json(), indent=1) + "\n")
    if workload.name == "emulated":
        import polars as pl

        from runtime.durations.tables import durations_frame_rows

        records = [(iteration, *row) for iteration in range(config.iters)
                   for row in durations_frame_rows(workload.durations(iteration))]
        frame = pl.DataFrame(records, schema=["iteration", "stage", "kind", "microbatch", "duration"], orient="row")
        write_whole(out_dir / "durations.parquet", frame.write_parquet)


METRICS_LOG = "metrics.jsonl"


class MetricsLog:
    """Rank 0's per-iteration metrics: a JSON line appended (and flushed) as each iteration ends, turned into
    ``metrics.parquet`` at the end, or by :func:`salvage_metrics` after a failure or an interrupt."""

    def __init__(self, out_dir: Path, resume_at: int = 0) -> None:
        self.out_dir = out_dir
        self.path = Path(out_dir) / METRICS_LOG
        kept = _rows_before(out_dir, resume_at) if resume_at else []  # a resumed run keeps the iterations before
        try:
            self.handle = open(self.path, "w")
        except OSError as err:
            raise write_error(err, self.path) from None
        for row in kept:
            self.append(row)

    def append(self, row: dict[str, Any]) -> None:
        """One iteration's row, on disk when this returns; a refused write (a full disk) raises
        :class:`hints.outputs.DiskError` and leaves the lines before it whole."""
        try:
            self.handle.write(json.dumps(row) + "\n")
            self.handle.flush()
        except OSError as err:
            raise write_error(err, self.path) from None

    def close(self) -> None:
        try:
            self.handle.close()
        except OSError as err:  # the last flush: every row was flushed when appended, so this is that row's tail
            raise write_error(err, self.path) from None
        salvage_metrics(self.out_dir)


def _rows_before(out_dir: Path, iteration: int) -> list[dict[str, Any]]:
    """The metrics rows of iterations before ``iteration`` that an earlier attempt left in ``out_dir``."""
    salvage_metrics(out_dir)  # an attempt that was killed may have left only metrics.jsonl
    path = Path(out_dir) / "metrics.parquet"
    if not path.exists():
        return []
    import polars as pl

    return [row for row in pl.read_parquet(path).to_dicts() if row["iteration"] < iteration]


def salvage_metrics(out_dir: Path) -> int:
    """Turn ``metrics.jsonl`` into ``metrics.parquet`` (complete lines only); returns how many iterations.

    Returns 0, writing nothing, when there is no log or no complete line. When ``metrics.parquet`` cannot be
    written (:class:`hints.outputs.DiskError`), ``metrics.jsonl`` stays as it was.
    """
    path = Path(out_dir) / METRICS_LOG
    if not path.exists():
        return 0
    rows = logged_rows(out_dir)
    if rows:
        import polars as pl

        write_whole(Path(out_dir) / "metrics.parquet", pl.DataFrame(rows).write_parquet)
    path.unlink()
    return len(rows)


def logged_rows(out_dir: Path) -> list[dict[str, Any]]:
    """The complete lines of ``metrics.jsonl`` (none without one): every iteration logged before a line cut
    short by a kill or a full disk."""
    try:
        lines = (Path(out_dir) / METRICS_LOG).read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short: everything before it is whole
            break
    return rows
