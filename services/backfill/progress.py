"""Console progress of a Spark job: a rich progress bar fed by the SparkContext's status
tracker (active stages, their tasks) and an accumulator of rows run through the engines."""

from __future__ import annotations

import threading
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class SparkProgress:
    """`with SparkProgress(spark, console, rows):` shows tasks of the running stages and the
    rows counted so far (`rows`: a Spark accumulator, updated as tasks finish)."""

    def __init__(self, spark: Any, console: Console, rows: Any = None,
                 interval_s: float = 0.25):
        self.tracker = spark.sparkContext.statusTracker()
        self.rows = rows
        self.interval_s = interval_s
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[rows]}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.task = self.progress.add_task("Spark", total=None, rows="")
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> SparkProgress:
        self.progress.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.progress.stop()

    def _poll(self) -> None:
        while not self.done.wait(self.interval_s):
            stages = [s for s in (self.tracker.getStageInfo(i)
                                  for i in self.tracker.getActiveStageIds()) if s is not None]
            total = sum(s.numTasks for s in stages)
            done = sum(s.numCompletedTasks for s in stages)
            names = ", ".join(f"{s.stageId}" for s in stages) or "-"
            rows = f"{self.rows.value:,} events run" if self.rows is not None else ""
            self.progress.update(self.task, description=f"Spark stages {names}",
                                 total=total or None, completed=done, rows=rows)
