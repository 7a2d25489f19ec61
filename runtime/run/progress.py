"""Rank 0's progress bar while a job runs: iterations done, loss, throughput (rich, on stderr).

Shown by ``rrfp run`` (not in ``--json`` mode) when stderr is a terminal: into a pipe or a log file rich
draws nothing but would still end the bar with an empty line. The worker updates it with each iteration's
metrics row (:func:`runtime.run.metrics.metrics_row`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.run.worker import Job


class ProgressBar:
    """Rank 0's rich progress bar: iterations, loss, throughput (stderr)."""

    def __init__(self, job: Job, config) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.progress = Progress(TextColumn(f"[bold]{job.name}[/] -> {job.out_dir}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                 console=console, transient=True, disable=not console.is_terminal)
        self.progress.start()
        self.task = self.progress.add_task(job.name, total=config.iters, status="")

    def update(self, row: dict) -> None:
        loss = "-" if row["loss"] is None else f"{row['loss']:.4f}"
        self.progress.update(self.task, advance=1,
                             status=f"loss {loss}  {row['throughput']:,.0f} {row['unit']}")

    def close(self) -> None:
        self.progress.stop()
