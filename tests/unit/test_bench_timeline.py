"""bench/_timeline.py: the records of a run turned into spans (parsing, unions, worker segments)."""
from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _timeline as tl  # noqa: E402


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


def local(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()  # naive: the machine's local time


def line(ts: str, event: str) -> dict:
    return {"timestamp": f"2026-12-01T{ts}Z", "event": event, "logger": "task"}


def test_parse_time_reads_utc_offsets_and_local_times():
    assert tl.parse_time("2026-12-01T02:58:11.567137Z") == at("2026-12-01T02:58:11.567137")
    assert tl.parse_time("2026-12-01T04:58:11+02:00") == at("2026-12-01T02:58:11")
    assert tl.parse_time("2026-12-01T02:58:11") == local("2026-12-01T02:58:11")
    assert tl.parse_time(None) is None and tl.parse_time("Unknown") is None


def test_jobcomp_reads_slurms_own_times():
    text = ("JobId=7 UserId=ultracluster(1001) GroupId=ultracluster(1001) Name=uc.compile JobState=COMPLETED "
            "Partition=compute1 TimeLimit=UNLIMITED StartTime=2026-12-01T10:00:05 EndTime=2026-12-01T10:00:42 "
            "NodeList=compute1-dy-trn1-[1-2] NodeCnt=2 ProcCnt=2 WorkDir=/fsx/x ReservationName= Tres=cpu=2 "
            "Account= QOS= WcKey= Cluster=c SubmitTime=2026-12-01T10:00:01 EligibleTime=2026-12-01T10:00:01 "
            "DerivedExitCode=0:0 ExitCode=0:0\n"
            "JobId=8 Name=uc.train JobState=FAILED StartTime=2026-12-01T10:01:00 EndTime=Unknown "
            "SubmitTime=2026-12-01T10:00:59\n"
            "garbage line\n")
    jobs = tl.jobcomp(text)
    assert set(jobs) == {"7", "8"}
    assert jobs["7"]["state"] == "COMPLETED" and jobs["7"]["name"] == "uc.compile"
    assert jobs["7"]["submit"] == local("2026-12-01T10:00:01")
    assert jobs["7"]["end"] - jobs["7"]["start"] == 37
    assert jobs["8"]["end"] is None and jobs["8"]["state"] == "FAILED"


def test_moto_request_times_count_request_lines_only():
    text = ('127.0.0.1 - - [01/Dec/2026 14:43:25] "POST / HTTP/1.1" 200 -\n'
            " * Running on http://127.0.0.1:5055\n"
            '127.0.0.1 - - [01/Dec/2026 14:43:26] "\x1b[31m\x1b[1mPOST / HTTP/1.1\x1b[0m" 400 -\n')
    assert tl.moto_request_times(text) == [local("2026-12-01T14:43:25"), local("2026-12-01T14:43:26")]


@pytest.mark.parametrize(("intervals", "merged"), [
    ([], []),
    ([(0, 2), (1, 3)], [(0, 3)]),            # overlap
    ([(0, 2), (2, 3)], [(0, 3)]),            # touching
    ([(5, 6), (0, 1)], [(0, 1), (5, 6)]),    # disjoint, unsorted
    ([(0, 10), (2, 3)], [(0, 10)]),          # nested
    ([(3, 3), (4, 2)], []),                  # empty and reversed dropped
])
def test_union_merges_overlaps(intervals, merged):
    assert tl.union(intervals) == merged


def test_covered_takes_the_union_clipped_to_the_window():
    busy = [(0, 10), (5, 20), (30, 40)]
    assert tl.covered(busy) == 30
    assert tl.covered(busy, (15, 35)) == 10  # 15-20 and 30-35


DEFERRING_TASK = [
    line("10:00:00.0", "::group::Pre Execute"),
    line("10:00:01.0", "::endgroup::"),
    line("10:00:02.0", "Submitted Slurm job 7 (uc.compile, 2 node(s)); log /fsx/slurm-7.out"),
    line("10:00:02.5", "::group::Post Execute"),
    line("10:00:02.6", "Pausing task as DEFERRED. "),
    line("10:00:03.0", "::endgroup::"),
    line("10:00:04.0", "trigger x (ID 1) starting"),
    line("10:00:30.0", "Trigger fired event"),
    line("10:00:30.1", "trigger completed"),
    line("10:00:32.0", "::group::Pre Execute"),
    line("10:00:32.5", "::endgroup::"),
    line("10:00:33.0", "Slurm job 7 COMPLETED"),
    line("10:00:33.1", "::group::Post Execute"),
    line("10:00:33.2", "Pushing xcom"),
    line("10:00:33.5", "::endgroup::"),
]


def test_worker_segments_sum_the_time_on_a_worker_only():
    events = tl.log_events([{"sources": ["a.log"]}, *reversed(DEFERRING_TASK)])  # order restored by time
    segments = tl.worker_segments(events)
    assert segments == [(at("2026-12-01T10:00:00"), at("2026-12-01T10:00:03")),
                        (at("2026-12-01T10:00:32"), at("2026-12-01T10:00:33.5"))]
    assert sum(e - s for s, e in segments) == pytest.approx(4.5)


def test_a_log_cut_inside_a_segment_closes_it_at_its_last_line():
    events = tl.log_events(DEFERRING_TASK[:3])
    assert tl.worker_segments(events) == [(at("2026-12-01T10:00:00"), at("2026-12-01T10:00:02"))]


def test_deferral_windows_fired_events_and_jobs():
    events = tl.log_events(DEFERRING_TASK)
    assert tl.fired(events) == [at("2026-12-01T10:00:30")]
    assert tl.deferred_windows(events) == [(at("2026-12-01T10:00:02.6"), at("2026-12-01T10:00:30"))]
    assert tl.submitted_jobs(events) == ["7"]
    # A deferral no event ended (the log stops there) is no window.
    assert tl.deferred_windows(tl.log_events(DEFERRING_TASK[:6])) == []


def test_count_in_windows_with_slack():
    windows = [(10.0, 20.0), (30.0, 31.0)]
    assert tl.count_in([9.0, 10.0, 15.0, 25.0, 31.0, 31.2], windows) == 3
    assert tl.count_in([9.0, 10.0, 15.0, 25.0, 31.0, 31.2], windows, slack=0.25) == 4
    assert tl.first_after([1.0, 5.0, 3.0], 2.0) == 3.0 and tl.first_after([1.0], 2.0) is None
    assert tl.ratio(1.0, 4.0) == 0.25 and tl.ratio(None, 4.0) is None and tl.ratio(1.0, 0) is None
