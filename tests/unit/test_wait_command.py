"""The head-node wait command (remote_commands.wait_job_end) run by a real bash, with a stand-in
`squeue` whose answer the test sets: it ends when the job does, streams the log from the offset,
and survives a failing squeue. tests/integration runs it against real Slurm over SSH."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ultracluster import remote_commands as rc
from ultracluster.parsers.slurm import parse_wait_end

# Stand-in Slurm programs live in tmp_path/bin (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("slurm_stand_ins")

SQUEUE = """#!/bin/bash
state=$(cat "$UC_TEST_STATE")
case "$state" in
  INVALID) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  DOWN) echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1 ;;
  *) echo "$state" ;;
esac
"""


def stand_in(tmp_path: Path, command: str, script: str, state: str) -> tuple[Path, dict[str, str]]:
    """A stand-in ``command`` first on PATH, and the file (``$UC_TEST_STATE``) it answers from."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / command).write_text(script)
    (bin_dir / command).chmod(0o755)
    state_file = tmp_path / "state"
    state_file.write_text(state)
    return state_file, {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "UC_TEST_STATE": str(state_file)}


@pytest.fixture
def head(tmp_path: Path):
    state, env = stand_in(tmp_path, "squeue", SQUEUE, "RUNNING\n")
    log = tmp_path / "slurm-7.out"

    def run(offset: int = 0, window_s: int = 600, interval_s: float = 0.2, timeout: float = 60):
        command = rc.wait_job_end("7", str(log), offset, interval_s=interval_s, window_s=window_s)
        done = subprocess.run(["bash", "-c", command.shell], env=env, capture_output=True, timeout=timeout)
        return done.stdout, parse_wait_end(done.stderr.decode())

    return state, log, run


def later(seconds: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()))
    thread.start()
    return thread


def test_the_jobs_end_ends_the_wait_long_before_its_window(head):
    state, log, run = head
    log.write_bytes(b"old line\n")

    def finish():
        with log.open("ab") as f:
            f.write(b"UC_PROGRESS step=1 total=1\nUC_RESULTS /fsx/r.json\n")
        state.write_text("COMPLETED\n")

    thread = later(1.0, finish)
    stdout, end = run(offset=len(b"old line\n"), window_s=600, timeout=60)  # a 600 s window: only the end wakes it
    thread.join()
    assert end.reason == "job-ended" and end.state == "COMPLETED"
    assert stdout == b"UC_PROGRESS step=1 total=1\nUC_RESULTS /fsx/r.json\n"


# The job writes its last lines while squeue answers: after the wait's copy, before "COMPLETED".
LAST_WORDS = """#!/bin/bash
printf 'UC_RESULTS /fsx/r.json\\n' >> "$UC_TEST_LOG"
echo COMPLETED
"""


def test_what_the_job_wrote_just_before_it_ended_is_streamed(tmp_path):
    _, env = stand_in(tmp_path, "squeue", LAST_WORDS, "")
    log = tmp_path / "slurm-7.out"
    log.write_bytes(b"UC_PROGRESS step=1 total=1\n")
    command = rc.wait_job_end("7", str(log), 0, interval_s=0.2, window_s=600)
    done = subprocess.run(["bash", "-c", command.shell], env={**env, "UC_TEST_LOG": str(log)},
                          capture_output=True, timeout=60)
    end = parse_wait_end(done.stderr.decode())
    assert end.reason == "job-ended" and end.state == "COMPLETED"
    assert done.stdout == b"UC_PROGRESS step=1 total=1\nUC_RESULTS /fsx/r.json\n"


def test_completing_is_still_active_and_a_forgotten_job_ends_the_wait(head):
    state, log, run = head
    state.write_text("COMPLETING\n")
    thread = later(0.8, lambda: state.write_text("INVALID\n"))
    _, end = run(window_s=600)
    thread.join()
    assert end.reason == "job-ended" and end.state == "GONE"


def test_a_failing_squeue_does_not_end_the_wait(head):
    state, log, run = head
    state.write_text("DOWN\n")
    _, end = run(window_s=1)
    assert end.reason == "window"


def test_window_and_log_shrink(head):
    state, log, run = head
    log.write_bytes(b"0123456789\n")
    stdout, end = run(offset=4, window_s=1)
    assert end.reason == "window" and stdout == b"456789\n"
    _, end = run(offset=100, window_s=600)
    assert end.reason == "log-shrank"


def test_no_end_line_is_a_lost_wait():
    assert parse_wait_end("Connection closed\n").reason == "lost"
    with pytest.raises(ValueError):
        rc.wait_job_end("7", "/x", 0, interval_s=0, window_s=10)
    with pytest.raises(ValueError):
        rc.wait_job_end("7; rm -rf /", "/x", 0, interval_s=1, window_s=10)
