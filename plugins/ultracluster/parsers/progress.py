"""The training job's marker lines (``UC_PROGRESS``, ``UC_RESULTS``, ``UC_ERROR``, ``UC_INFO``) and
which of them a task log shows.

The job prints one ``UC_PROGRESS`` line per logged optimizer step (28,125 for BERT-Large phase 1);
its own Slurm log keeps them all. ``ProgressThrottle`` picks the few a task log shows. Stdlib only.
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass, field

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
        if first or last or on_step:
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


_CHECKPOINT = re.compile(r"^ckpt_(\d+)\.pt$")


def newest_checkpoint(listing: str) -> int | None:
    """Step of the newest complete checkpoint in ``remote_commands.list_files`` output of a
    ``checkpoints/`` directory (``ckpt_<step>.pt``; the ``.tmp`` of a save in progress is not one)."""
    steps = [int(m.group(1)) for line in listing.splitlines()
             if (m := _CHECKPOINT.match(line.strip().split(" ", 1)[-1]))]
    return max(steps, default=None)
