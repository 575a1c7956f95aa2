"""The training job's marker lines, and which progress lines reach the task log (ProgressThrottle)."""
from __future__ import annotations

import pytest

from ultracluster.parsers.progress import ProgressThrottle, find_results_path, has_marker, parse_progress_line


def line(step: int, total: int = 28125, loss: float = 7.0) -> str:
    return f"UC_PROGRESS step={step} total={total} loss={loss:.6f} lr=0.000100 throughput=3500.00 eta_s=100"


def test_progress_lines():
    text = "UC_PROGRESS step=12 total=40 loss=7.123456 lr=0.000100 throughput=35.21 eta_s=83"
    progress = parse_progress_line(text)
    assert (progress.step, progress.total, progress.loss, progress.throughput, progress.eta_s) == (12, 40, 7.123456, 35.21, 83)
    assert progress.lr == pytest.approx(0.0001)
    assert progress.to_dict() == {"step": 12, "total": 40, "loss": 7.123456, "throughput": 35.21, "eta_s": 83}
    assert parse_progress_line("0: " + text).step == 12  # srun --label
    assert parse_progress_line("UC_PROGRESS total=3") is None
    assert parse_progress_line("some other line") is None
    log = f"x\n{text}\nUC_RESULTS /fsx/job/output_7/results.json\nUC_ERROR no data\n"
    assert find_results_path(log) == "/fsx/job/output_7/results.json"
    assert [has_marker(ln) for ln in log.splitlines()] == [False, True, True, True]


def replay(throttle: ProgressThrottle, steps: int, seconds_per_step: float, *, batch: int = 1,
           losses=lambda step: 7.0) -> list[int]:
    """Feed ``steps`` lines (``batch`` per poll) with a fake clock; the steps the task log shows."""
    shown: list[str] = []
    now = 0.0
    for step in range(1, steps + 1):
        now = step * seconds_per_step
        shown += throttle.offer(line(step, steps, losses(step)), parse_progress_line(line(step, steps)), now)
        if step % batch == 0 or step == steps:
            shown += throttle.flush(now, final=step == steps)
    return [parse_progress_line(s).step for s in shown]


def test_bert_large_phase_1_shows_one_line_per_30_s_not_28125():
    # 28,125 steps at 1.02 s each (16 nodes, the blog's ~8 h), read by 60 s polls.
    shown = replay(ProgressThrottle(interval_s=30), 28125, 1.02, batch=59)
    assert shown[0] == 1 and shown[-1] == 28125
    assert len(shown) == len(set(shown)) and shown == sorted(shown)
    assert 28125 * 1.02 / 60 - 5 <= len(shown) <= 28125 * 1.02 / 60 + 5  # one per poll: 60 s > 30 s
    # Fast polls: the interval rules, never more than one line per 30 s.
    shown = replay(ProgressThrottle(interval_s=30), 3000, 1.0, batch=3)
    assert shown[0] == 1 and shown[-1] == 3000
    assert all(b - a >= 30 for a, b in zip(shown[1:-1], shown[2:-1])), shown
    assert 99 <= len(shown) <= 102


def test_a_zero_interval_shows_every_line_even_when_one_read_holds_several():
    # The job wait's stream can deliver steps 2 and 3 in one chunk; the last step must not fold step 2.
    assert replay(ProgressThrottle(interval_s=0), 3, 1.0, batch=3) == [1, 2, 3]
    assert replay(ProgressThrottle(interval_s=0), 5, 0.0, batch=5) == [1, 2, 3, 4, 5]


def test_every_n_steps_mode():
    shown = replay(ProgressThrottle(every_steps=10), 40, 0.4)
    assert shown == [1, 10, 20, 30, 40]
    shown = replay(ProgressThrottle(every_steps=10), 37, 0.4)
    assert shown == [1, 10, 20, 30, 37]  # the last step of the run always shows


def test_a_loss_spike_always_shows():
    def losses(step: int) -> float:
        return 30.0 if step == 55 else 7.0 - step / 100

    throttle = ProgressThrottle(every_steps=50)
    shown_lines = []
    for step in range(1, 101):
        text = line(step, 100, losses(step))
        shown_lines += throttle.offer(text, parse_progress_line(text), float(step))
    steps = [parse_progress_line(s).step for s in shown_lines]
    assert steps == [1, 50, 55, 100]
    assert "loss spike" in shown_lines[2] and "loss spike" not in shown_lines[3]


def test_the_newest_held_line_shows_when_the_job_ends():
    throttle = ProgressThrottle(interval_s=30)
    assert throttle.offer(line(1, 100), parse_progress_line(line(1, 100)), 0.0) == [line(1, 100)]
    assert throttle.offer(line(2, 100), parse_progress_line(line(2, 100)), 1.0) == []
    assert throttle.offer(line(3, 100), parse_progress_line(line(3, 100)), 2.0) == []
    assert throttle.flush(2.0) == []
    assert throttle.flush(2.0, final=True) == [line(3, 100)]  # the job failed at step 3
    assert throttle.flush(3.0, final=True) == []


def test_bad_every_steps_is_refused():
    with pytest.raises(ValueError):
        ProgressThrottle(every_steps=0)
