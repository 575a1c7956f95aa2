"""The fleet wait's Slurm gate on the head node: the command (remote_commands.wait_nodes_change) run by a
real bash with a stand-in `sinfo` whose output the test sets (captured real outputs), and the
ComputeFleetTrigger driving it through SlurmHook over a connection that runs each command in a local
bash (the transport is the only stand-in). tests/integration/test_fleet_wait.py runs it on real Slurm."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.test_wait_command import stand_in
from ultracluster import remote_commands as rc
from ultracluster.hooks.head_node import HeadNodeHook
from ultracluster.parsers.slurm import parse_wait_end
import ultracluster.triggers.fleet as fleet_trigger_module
from ultracluster.triggers.fleet import ComputeFleetTrigger

# Stand-in Slurm programs live in tmp_path/bin (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("slurm_stand_ins")


def when(condition, action) -> threading.Thread:
    """Run ``action`` in a thread once ``condition()`` holds (the test gives up after 60 s)."""
    def wait_then_act():
        deadline = time.monotonic() + 60
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread


def sinfo_runs(head) -> int:
    return len(head.calls.read_text().splitlines())

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinnedAtFirstContact"

# Prints the state file, or fails like sinfo does while slurmctld is down; logs its arguments.
SINFO = """#!/bin/bash
echo "$*" >> "$UC_TEST_CALLS"
state=$(cat "$UC_TEST_STATE")
if [ "$state" = DOWN ]; then echo "slurm_load_partitions: Unable to contact slurm controller" >&2; exit 1; fi
printf '%s' "$state"
"""


def captured(name: str) -> str:
    return (FIXTURES / "slurm" / f"{name}.out").read_text()


@pytest.fixture
def head(tmp_path: Path):
    state, env = stand_in(tmp_path, "sinfo", SINFO, captured("sinfo_mix_alloc"))
    calls = tmp_path / "calls"
    calls.write_text("")
    return SimpleNamespace(state=state, calls=calls, env={**env, "UC_TEST_CALLS": str(calls)})


def run_command(head, seen: str, window_s: int = 600, partition: str | None = "compute1", timeout: float = 60):
    command = rc.wait_nodes_change(partition, seen, interval_s=0.2, window_s=window_s)
    done = subprocess.run(["bash", "-c", command.shell], input=command.stdin.encode(), env=head.env,
                          capture_output=True, timeout=timeout)
    return done.stdout.decode(), parse_wait_end(done.stderr.decode())


# ------------------------------------------------------------------------------- the command


def test_lines_other_than_the_judged_ones_end_the_wait_at_once(head):
    head.state.write_text(captured("sinfo_idle"))  # ready now; the trigger judged the busy lines
    stdout, end = run_command(head, seen=captured("sinfo_mix_alloc"), window_s=600)
    assert end.reason == "changed" and stdout == captured("sinfo_idle")
    assert head.calls.read_text().splitlines() == ["--noheader --Node --format %P|%a|%D|%T|%N|%E --partition compute1"]


def test_a_node_going_down_ends_the_wait_with_the_new_lines(head):
    thread = when(lambda: sinfo_runs(head) >= 1, lambda: head.state.write_text(captured("sinfo_power_up_failed")))
    stdout, end = run_command(head, seen=captured("sinfo_mix_alloc"), window_s=600)  # only the change ends it
    thread.join()
    assert end.reason == "changed" and stdout == captured("sinfo_power_up_failed")
    assert len(head.calls.read_text().splitlines()) >= 2  # it checked, unchanged, before the node went down


def test_unchanged_lines_and_a_failing_sinfo_wait_out_the_window(head):
    stdout, end = run_command(head, seen=captured("sinfo_mix_alloc"), window_s=1)
    assert end.reason == "window" and stdout == ""
    head.state.write_text("DOWN")
    stdout, end = run_command(head, seen=captured("sinfo_mix_alloc"), window_s=1, partition=None)
    assert end.reason == "window" and stdout == ""
    assert head.calls.read_text().splitlines()[-1] == "--noheader --Node --format %P|%a|%D|%T|%N|%E"


def test_bad_arguments_are_refused_and_the_partition_is_one_word(head):
    with pytest.raises(ValueError):
        rc.wait_nodes_change("compute1", "", interval_s=0, window_s=10)
    injected = head.state.parent / "injected"
    _, end = run_command(head, seen=captured("sinfo_mix_alloc"), window_s=1, partition=f"q; touch {injected}")
    assert end.reason == "window" and not injected.exists()
    assert head.calls.read_text().splitlines()[-1].endswith(f"--partition q; touch {injected}")


# ------------------------------------------------------------------------------ the trigger


class LocalProcess:
    """asyncssh's SSHClientProcess, as much of it as SlurmHook uses, over a local subprocess."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.stdout, self.stderr = process.stdout, process.stderr
        self.stdin = SimpleNamespace(write=process.stdin.write, write_eof=process.stdin.close)

    @property
    def exit_status(self):
        return self._process.returncode

    async def wait(self):
        return await self._process.wait()

    def close(self):
        if self._process.returncode is None:
            self._process.kill()


class LocalConn:
    """An asyncssh connection's ``run`` and ``create_process``, each command run by a local bash."""

    def __init__(self, env) -> None:
        self.env, self.runs, self.processes = env, [], []

    async def _start(self, shell: str):
        return await asyncio.create_subprocess_exec("bash", "-c", shell, env=self.env, stdin=subprocess.PIPE,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    async def run(self, shell, *, input=None, check=False, timeout=None):
        self.runs.append(shell)
        process = await self._start(shell)
        out, err = await process.communicate((input or "").encode())
        return SimpleNamespace(stdout=out.decode(), stderr=err.decode(), exit_status=process.returncode)

    async def create_process(self, shell, encoding=None):
        self.processes.append(shell)
        return LocalProcess(await self._start(shell))


class Pcluster:
    def __init__(self, description: dict) -> None:
        self.description, self.calls = description, 0

    async def adescribe_cluster(self, cluster_name):
        self.calls += 1
        return self.description


@pytest.fixture
def fleet(head, monkeypatch):
    """A trigger whose describe-cluster says ready and whose head node is the local bash."""
    conns: list[LocalConn] = []

    @contextlib.asynccontextmanager
    async def aconnection(self):
        conns.append(LocalConn(head.env))
        yield conns[-1]

    monkeypatch.setattr(HeadNodeHook, "aconnection", aconnection)
    pcluster = Pcluster(json.loads((FIXTURES / "pcluster" / "describe_cluster_create_complete.json").read_text()))

    def run(**kwargs) -> dict:
        params = dict(cluster_name="uc-run1", num_nodes=3, partition=None, pcluster_conn_id="pcluster_default",
                      ssh_conn_id="ultracluster_head_node", ssh_port=2222, host_key=HOST_KEY, keep_host_key=True,
                      poke_interval=600)  # a poll interval the test never waits out
        trigger = ComputeFleetTrigger(**{**params, **kwargs})

        async def first():
            monkeypatch.setattr(fleet_trigger_module, "ParallelClusterHook", lambda **_: pcluster)
            async for event in trigger.run():
                return event.payload

        return asyncio.run(asyncio.wait_for(first(), timeout=60))

    return SimpleNamespace(run=run, conns=conns, pcluster=pcluster)


def test_nodes_becoming_idle_wake_the_trigger_through_the_head_node_wait(head, fleet):
    # Idle once the head-node wait has checked (the trigger's own sinfo is the first run).
    thread = when(lambda: sinfo_runs(head) >= 2, lambda: head.state.write_text(captured("sinfo_idle")))
    event = fleet.run(wait_window_s=600)
    thread.join()
    assert event["status"] == "success" and event["head_node"]["partition"] == "compute1", event
    assert "idle 2, idle~ (powered down) 2" in event["message"]
    # One connection: one sinfo round trip (busy: wait), then one head-node wait that ended on the change.
    [conn] = fleet.conns
    assert len(conn.runs) == 1 and "sinfo" in conn.runs[0]
    assert len(conn.processes) == 1 and "UC_WAIT_END" in conn.processes[0]
    assert fleet.pcluster.calls == 1


def test_a_node_failing_to_power_up_is_judged_by_the_lost_node_rule(head, fleet):
    thread = when(lambda: sinfo_runs(head) >= 2, lambda: head.state.write_text(captured("sinfo_power_up_failed")))
    event = fleet.run(num_nodes=3, wait_window_s=600, node_replacements=0)  # waits: 2 idle~, 2 busy
    thread.join()
    assert (event["status"], event["reason"]) == ("failed", "node_lost"), event
    assert event["message"].startswith("Nodes lost past node_replacements=0: compute1-dy-trn1-1 (down#: "
                                       "(Code:InsufficientInstanceCapacity)Failure when resuming nodes) lost 1 time(s)")
    assert event["lost_nodes"]["counts"] == {"compute1-dy-trn1-1": 1, "compute1-dy-trn1-2": 1}
    assert len(fleet.conns) == 1 and len(fleet.conns[0].processes) == 1


def test_lost_nodes_within_their_replacements_are_waited_for_and_counted(head, fleet):
    # Both nodes failed to power up; ParallelCluster replaces them (idle again): the wait goes on.
    head.state.write_text(captured("sinfo_power_up_failed"))
    # Replaced atomically: sinfo runs about once a second and must never read a half-written state.
    replaced = head.state.with_suffix(".next")
    replaced.write_text(captured("sinfo_idle"))
    thread = when(lambda: sinfo_runs(head) >= 2, lambda: os.replace(replaced, head.state))
    event = fleet.run(num_nodes=2, wait_window_s=600)
    thread.join()
    assert event["status"] == "success", event
    assert event["lost_nodes"]["counts"] == {"compute1-dy-trn1-1": 1, "compute1-dy-trn1-2": 1}
    assert event["lost_nodes"]["failing"] == []  # seen healthy again: a next failure is a new loss
    # A task's earlier losses count: one more loss of the same node is past the one replacement.
    head.state.write_text(captured("sinfo_power_up_failed"))
    event = fleet.run(num_nodes=2, wait_window_s=600, lost_nodes=event["lost_nodes"])
    assert event["reason"] == "node_lost" and "compute1-dy-trn1-1 (down#: " in event["message"], event
    assert "lost 2 time(s)" in event["message"]


def test_each_window_rechecks_describe_cluster_on_the_same_connection(head, fleet):
    # Idle only once a window has passed and describe-cluster was asked again.
    thread = when(lambda: fleet.pcluster.calls >= 2, lambda: head.state.write_text(captured("sinfo_idle")))
    event = fleet.run(wait_window_s=1)
    thread.join()
    assert event["status"] == "success", event
    [conn] = fleet.conns
    assert len(conn.runs) == 1 and len(conn.processes) >= 2  # a window passed unchanged at least once
    assert fleet.pcluster.calls == len(conn.processes)  # the first gate, then once per window


def test_a_drained_node_fails_the_wait_when_stuck_not_at_the_windows_end(head, fleet):
    # compute1: 2 busy, 1 idle~, 1 drained: 3 nodes could come free, so the wait goes on until the
    # drained node has stayed so for stuck_after_s; the 600 s window is cut to that.
    head.state.write_text(captured("sinfo_powering_up"))
    event = fleet.run(wait_window_s=600, stuck_after_s=1)
    assert (event["status"], event["reason"]) == ("failed", "nodes_stuck") and "stayed down, drained or not responding" in event["message"], event
    assert "compute1-st-trn1-2 (drained: Kernel panic on boot)" in event["message"]
    assert len(fleet.conns) == 1 and len(fleet.conns[0].processes) >= 1
