"""Rank 0's progress while a job runs (stderr): a rich progress bar on a terminal, a line per iteration elsewhere.

Shown by ``rrfp run`` (not in ``--json`` mode). On a terminal: rich's bar with iterations done, loss and
throughput. Into a pipe or a log file (CI logs, batch jobs) rich draws nothing, so the job says where it writes
when it starts and then prints one line per iteration (step time, loss, throughput), each flushed as it is
written, so a log shows the run as it goes. Either is updated with each iteration's metrics row
(:func:`runtime.run.metrics.metrics_row`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.run.worker import Job


def _loss(row: dict) -> str:
    return "-" if row["loss"] is None else f"{row['loss']:.4f}"


class ProgressBar:
    """Rank 0's progress on stderr: a rich bar on a terminal, else one flushed line per iteration."""

    def __init__(self, job: Job, config) -> None:
        from rich.console import Console

        console = Console(stderr=True)
        self.lines = not console.is_terminal
        self.name = job.name
        if self.lines:
            self._say(f"{job.name}: {config.iters} iterations -> {job.out_dir}")
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn(f"[bold]{job.name}[/] -> {job.out_dir}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                 console=console, transient=True)
        self.progress.start()
        self.task = self.progress.add_task(job.name, total=config.iters, status="")

    def update(self, row: dict) -> None:
        if self.lines:
            self._say(f"{self.name}: iteration {row['iteration']}  step {row['wall_seconds'] * 1e3:.1f} ms  "
                      f"loss {_loss(row)}  {row['throughput']:,.0f} {row['unit']}")
            return
        self.progress.update(self.task, advance=1,
                             status=f"loss {_loss(row)}  {row['throughput']:,.0f} {row['unit']}")

    def close(self) -> None:
        if not self.lines:
            self.progress.stop()

    @staticmethod
    def _say(line: str) -> None:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except OSError:  # a closed or full log: progress is not worth failing the job for
            pass
