"""A command's progress on stderr, one stage at a time, each named.

On a terminal, a bar per stage (``l5dask: pass agents [#####   ] 61% 19/31 tasks 0.8 s``), redrawn
in place and left on its own line when the stage ends; in a log (stderr is not a terminal), one
line per stage when it ends: its name, its tasks and its time (``l5dask: pass agents: 31 tasks in
0.8 s``), not bars run together on one line. Stages shorter than ``minimum()`` are not shown.

What it costs: dask's ``ProgressBar`` (used before) stops by joining a timer thread that sleeps its
tick (0.5 s here), so every compute waited up to 0.5 s at its end: ``l5dask chop`` of the demo's
200 scenes (8 computes) took 5.1 s with it against 1.0 s without. Here the timer waits on an event
that the stage's end sets: the stage ends when its last task does (figures in
benchmarks/progress_benchmark.py).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

from l5dask.core import config

#: how often a terminal's bar is redrawn (s)
TICK = 0.1
WIDTH = 24


def minimum() -> float:
    """Seconds under which a stage is not shown (reading a few rows: a command makes several):
    the setting ``l5dask.progress-minimum`` (0.1 in ``l5dask.yaml``)."""
    return float(config.get("progress-minimum"))


def is_terminal(out: IO[str]) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


def stage_name(name: str) -> str:
    """A task name as a stage's (``l5-agents-mask`` -> ``agents-mask``)."""
    return name[3:] if name.startswith("l5-") else name


def passes_label(labels: Iterable[str]) -> str:
    """How a compute of passes is named (``pass agents``, ``passes agents, tl_faces``)."""
    names = list(dict.fromkeys(labels))
    return ("pass " if len(names) == 1 else "passes ") + ", ".join(names) if names else "compute"


def _line(label: str, done: int, total: int, elapsed: float, bar: bool) -> str:
    if not bar:
        return f"l5dask: {label}: {total:,} tasks in {elapsed:.1f} s"
    frac = done / total if total else 1.0
    return (
        f"\rl5dask: {label} [{'#' * int(WIDTH * frac):<{WIDTH}}] {int(100 * frac):3d}% "
        f"{done:,}/{total:,} tasks {elapsed:.1f} s"
    )


class Progress:
    """The progress of one local compute (dask's threaded scheduler), named ``label``: a context
    manager around it (dask's callbacks, imported when one is made)."""

    def __init__(self, label: str, out: IO[str] | None = None) -> None:
        self.label = label
        self.out = out if out is not None else sys.stderr
        self.bar = is_terminal(self.out)
        self._state: dict | None = None
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._t0 = 0.0
        self._minimum = minimum()
        self._drawn = False

    def __enter__(self) -> Progress:
        from dask.callbacks import Callback

        self._callback = Callback(start=self._start, start_state=self._start_state, finish=self._finish)
        self._callback.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._callback.__exit__(*exc)

    def _start(self, dsk: Any) -> None:
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._drawn = False
        if self.bar:
            self._timer = threading.Thread(target=self._tick, name="l5dask-progress", daemon=True)
            self._timer.start()

    def _start_state(self, dsk: Any, state: dict) -> None:
        self._state = state  # (dask's own, updated in place as tasks end)

    def _counts(self) -> tuple[int, int]:
        s = self._state
        if not s:
            return 0, 0
        done = len(s["finished"])
        return done, done + sum(len(s[k]) for k in ("ready", "waiting", "running"))

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            elapsed = time.perf_counter() - self._t0
            if elapsed >= self._minimum:
                done, total = self._counts()
                self._write(_line(self.label, done, total, elapsed, bar=True))
                self._drawn = True

    def _finish(self, dsk: Any, state: dict, errored: bool) -> None:
        self._stop.set()  # (the timer wakes now, not at its next tick)
        if self._timer is not None:
            self._timer.join()
            self._timer = None
        elapsed = time.perf_counter() - self._t0
        if errored:
            if self._drawn:
                self._write("\n")
            return
        if elapsed < self._minimum and not self._drawn:
            return
        done, total = self._counts()
        self._write(_line(self.label, done, max(total, done), elapsed, self.bar) + "\n")

    def _write(self, text: str) -> None:
        _emit(self.out, text)


def _emit(out: IO[str], text: str) -> None:
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):  # (a closed stderr: the work goes on)
        pass


def on_cluster(futures: list, label: str, tasks: int, out: IO[str] | None = None) -> None:
    """Wait for ``futures`` (a compute on a dask.distributed cluster) showing its progress: on a
    terminal, distributed's bar, named; in a log, one line when it ends."""
    stream: IO[str] = out if out is not None else sys.stderr
    t0 = time.perf_counter()
    if is_terminal(stream):
        from distributed.diagnostics.progressbar import TextProgressBar

        class Bar(TextProgressBar):  # (distributed's, drawn as the local bar: named, on stderr)
            def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:  # noqa: A002 - distributed's name
                _emit(stream, _line(label, all - remaining, all, time.perf_counter() - t0, bar=True))

            def _draw_stop(self, **kwargs: Any) -> None:
                _emit(stream, "\n")

        Bar(futures, interval="50ms")  # (returns when the futures are done)
        return
    from distributed import wait

    wait(futures)
    elapsed = time.perf_counter() - t0
    if elapsed >= minimum():
        _emit(stream, _line(label, tasks, tasks, elapsed, bar=False) + " on the cluster\n")
