"""The training job's marker lines (``UC_PROGRESS``, ``UC_RESULTS``, ``UC_ERROR``, ``UC_INFO``) and
which of them a task log shows.

The job prints one ``UC_PROGRESS`` line per logged optimizer step (28,125 for BERT-Large phase 1);
its own Slurm log keeps them all. ``ProgressThrottle`` picks the few a task log shows; ``JobLog``
follows a job's log for both Slurm waits (the trigger and the worker-side one).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ultracluster.run.cost import budget_verdict

PROGRESS_PREFIX = "UC_PROGRESS "
RESULTS_PREFIX = "UC_RESULTS "
ERROR_PREFIX = "UC_ERROR "
INFO_PREFIX = "UC_INFO "
MARKERS = (PROGRESS_PREFIX, RESULTS_PREFIX, ERROR_PREFIX, INFO_PREFIX)


@dataclass(frozen=True)
class Progress:
    step: int
    total: int | None
    loss: float | None
    lr: float | None
    throughput: float | None
    eta_s: float | None
    extra: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, float | int | None]:
        return {"step": self.step, "total": self.total, "loss": self.loss, "throughput": self.throughput,
                "eta_s": self.eta_s}


def _number(value: str | None, kind: type = float):
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        return None


def error_reasons(text: str) -> list[str]:
    """The reasons of the ``UC_ERROR <reason>`` lines in ``text``: the job refusing its own input,
    which no retry can fix."""
    return [line[line.find(ERROR_PREFIX) + len(ERROR_PREFIX):].strip()
            for line in text.splitlines() if ERROR_PREFIX in line]


def parse_launch(text: str) -> dict[str, str | None]:
    """``UC_INFO launch mode=<launcher|compile_only> [path=<path>] ...`` (the job's launch marker) as
    ``{"mode", "path"}``; mode ``unknown`` when there is no such line."""
    for line in reversed(text.splitlines()):
        if f"{INFO_PREFIX}launch " in line:
            words = dict(word.split("=", 1) for word in line.split() if "=" in word)
            return {"mode": words.get("mode", "unknown"), "path": words.get("path")}
    return {"mode": "unknown", "path": None}


def has_marker(line: str) -> bool:
    return any(marker in line for marker in MARKERS)


def parse_progress_line(line: str) -> Progress | None:
    """``UC_PROGRESS step=12 total=40 loss=7.123456 lr=0.000100 throughput=35.21 eta_s=83``.

    ``total`` is the step this run ends at. Returns None for any other line, or a progress line
    without a valid step. A line may carry a prefix (srun ``--label`` adds ``0: ``), so the marker is
    searched, not anchored.
    """
    start = line.find(PROGRESS_PREFIX)
    if start < 0:
        return None
    tokens: dict[str, str] = {}
    for token in line[start + len(PROGRESS_PREFIX) :].split():
        key, sep, value = token.partition("=")
        if sep:
            tokens[key] = value
    step = _number(tokens.pop("step", None), int)
    if step is None:
        return None
    return Progress(
        step=step,
        total=_number(tokens.pop("total", None), int),
        loss=_number(tokens.pop("loss", None)),
        lr=_number(tokens.pop("lr", None)),
        throughput=_number(tokens.pop("throughput", None)),
        eta_s=_number(tokens.pop("eta_s", None)),
        extra=tokens,
    )


def find_results_path(text: str) -> str | None:
    """Last ``UC_RESULTS <path>`` in a log."""
    found = None
    for line in text.splitlines():
        start = line.find(RESULTS_PREFIX)
        if start >= 0:
            found = line[start + len(RESULTS_PREFIX) :].strip() or found
    return found


class ProgressThrottle:
    """Which progress lines a task log shows: at most one per ``interval_s`` (the newest one due), or
    instead every ``every_steps`` steps; always the first and the last step of the run, and any loss
    spike (a loss above ``spike_factor`` × the median of the last ``window`` logged losses).
    ``interval_s=0`` shows every line.

    Feed lines in order with ``offer``; call ``flush`` after each batch read, with ``final=True`` once
    the job has ended (its newest line is then shown whatever the interval).
    """

    def __init__(self, *, interval_s: float = 30.0, every_steps: int | None = None,
                 spike_factor: float = 1.5, window: int = 20) -> None:
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {every_steps}")
        self.interval_s = float(interval_s)
        self.every_steps = every_steps
        self.spike_factor = spike_factor
        self._losses: deque[float] = deque(maxlen=window)
        self._logged_at: float | None = None
        self._pending: tuple[str, Progress] | None = None

    def _spike(self, progress: Progress) -> bool:
        return (progress.loss is not None and bool(self._losses)
                and progress.loss > self.spike_factor * statistics.median(self._losses))

    def _take(self, line: str, progress: Progress, now: float) -> list[str]:
        self._pending = None
        self._logged_at = now
        if progress.loss is not None:
            self._losses.append(progress.loss)
        return [line]

    def offer(self, line: str, progress: Progress, now: float) -> list[str]:
        """The lines to log now for this progress line (none, or this one)."""
        if self._spike(progress):
            return self._take(f"{line}  [loss spike: above {self.spike_factor}x the recent median]", progress, now)
        first = self._logged_at is None
        last = progress.total is not None and progress.step >= progress.total
        on_step = self.every_steps is not None and progress.step % self.every_steps == 0
        unthrottled = self.every_steps is None and self.interval_s <= 0  # a batch must not fold lines
        if first or last or on_step or unthrottled:
            return self._take(line, progress, now)
        self._pending = (line, progress)
        return []

    def flush(self, now: float, *, final: bool = False) -> list[str]:
        """The held-back newest line, when its interval has passed (or the job has ended)."""
        if self._pending is None:
            return []
        line, progress = self._pending
        due = self.every_steps is None and (self._logged_at is None or now - self._logged_at >= self.interval_s)
        return self._take(line, progress, now) if final or due else []


class JobLog:
    """A job's Slurm log as a wait follows it: the task log's lines, the newest progress, the results
    path, and the budget guard's verdict, from the bytes after ``offset``.

    :param log: where the chosen lines go (the task's or the trigger's logger).
    :param budget: ``{"max_usd", "usd_per_hour", "since"}`` (``cost.budget_verdict``); None: off.
    """

    def __init__(self, log: Any, *, path: str, offset: int = 0, interval_s: float = 30,
                 every_steps: int | None = None, budget: Mapping[str, Any] | None = None) -> None:
        self.log = log
        self.path = path
        self.offset = int(offset)
        self.budget = dict(budget) if budget else None
        self.over_budget: str | None = None
        self.last_progress: dict[str, Any] | None = None
        self.results_path: str | None = None
        self._throttle = ProgressThrottle(interval_s=interval_s, every_steps=every_steps)
        self._progress_seen = 0
        self._pending = b""  # streamed bytes after the last complete line

    def consume(self, size: int, data: bytes, max_bytes: int) -> bool:
        """Log the complete new lines of a read from ``offset`` (``size``: the file's size, -1 for a
        stream); True when more data is waiting."""
        if 0 <= size < self.offset:
            # The log was replaced (a job rerun into the same file): start again from its top.
            self.log.warning("Slurm log %s shrank below offset %d; rereading it", self.path, self.offset)
            self.offset = 0
            return True
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) >= max_bytes:
            end = len(data)  # one enormous line: move past it rather than stall on it forever
        now = time.monotonic()
        for raw in data[:end].splitlines():
            self._line(raw.decode("utf-8", errors="replace").strip(), now)
        self.offset += end
        # Only a read cut at max_bytes means more is waiting; a partial line waits for the next read.
        return end > 0 and len(data) >= max_bytes

    def _line(self, line: str, now: float) -> None:
        if not has_marker(line):
            return
        if (progress := parse_progress_line(line)) is not None:
            self.last_progress = progress.to_dict()
            self._progress_seen += 1
            # Not on the first line seen: its ETA comes from a step that includes warm-up (graph
            # load, compile) and overstates the rest of the run many times over.
            if self.budget and not self.over_budget and self._progress_seen > 1:
                self.over_budget = budget_verdict(self.budget, progress.eta_s)
            for shown in self._throttle.offer(line, progress, now):
                self.log.info("%s", shown)
            return
        # The newest held-back progress line goes first: it is the context of an error or result.
        for shown in [*self._throttle.flush(now, final=True), line]:
            self.log.info("%s", shown)
        if (results := find_results_path(line)) is not None:
            self.results_path = results

    def stream(self, chunk: bytes) -> bool:
        """Log streamed bytes as they come; False (stop waiting) once the budget is exceeded."""
        self._pending += chunk
        before = self.offset
        self.consume(-1, self._pending, max_bytes=len(self._pending) + 1)
        self._pending = self._pending[self.offset - before:]
        self.flush(final=False)
        return not self.over_budget

    def restart_stream(self) -> None:
        """A new stream starts at ``offset``: forget a partial line of the last one."""
        self._pending = b""

    def flush(self, *, final: bool) -> None:
        for shown in self._throttle.flush(time.monotonic(), final=final):
            self.log.info("%s", shown)
