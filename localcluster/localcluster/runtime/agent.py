"""Per-cluster agent: injects the kill-node and ssh-outage faults.

Run as `python -m localcluster.runtime.agent CLUSTER_DIR`; exits once every fault has played out.
`python -m localcluster.runtime.agent CLUSTER_DIR ssh-outage-now (--duration S | --release FILE)` starts
an ssh outage at once (tests: the sshd-outage e2e case, the trigger's outage test).
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from . import sshd
from .nodes import kill_node_processes, read_daemons, read_node_state, utc_now_iso
from .paths import ClusterPaths
from .procs import cmdline, kill_pids, pids_in_namespaces
from .runtime_state import cluster_paths, load_runtime
from .slurmcmd import expand_hostlist, set_node_state, slurm

POLL_S = 1.0   # squeue once a second is enough and cheap on 2 cores
KILLED_REASON = "Node failure: instance terminated"


def log(message: str) -> None:
    print(f"{utc_now_iso()} {message}", flush=True)


def _running_jobs(paths: ClusterPaths) -> list[tuple[str, float, str]]:
    """(job id, start epoch, nodelist) of running jobs, oldest first."""
    out = slurm(paths, "squeue", "-h", "-t", "R", "-o", "%i|%S|%N", check=False, timeout=10)
    jobs = []
    for line in out.splitlines():
        job_id, start, nodelist = (line.split("|") + ["", ""])[:3]
        try:
            started = datetime.strptime(start, "%Y-%m-%dT%H:%M:%S").timestamp()  # local time, as Slurm prints
        except ValueError:
            continue
        if nodelist:
            jobs.append((job_id, started, nodelist))
    return sorted(jobs, key=lambda j: j[1])


class KillNodeFault:
    """Kill the first compute node running a job, `after` seconds after that job started; once."""

    def __init__(self, paths: ClusterPaths, after: float) -> None:
        self.paths, self.after = paths, after
        self.target: tuple[str, float, str] | None = None
        self.done = False

    def step(self) -> None:
        if self.done:
            return
        jobs = _running_jobs(self.paths)
        if self.target is not None and self.target[0] not in {j[0] for j in jobs}:
            log(f"kill-node: job {self.target[0]} ended first; waiting for the next job")
            self.target = None   # the fault is meant to hit a running job
        if self.target is None:
            if not jobs:
                return
            job_id, started, nodelist = jobs[0]
            self.target = (job_id, started, expand_hostlist(self.paths, nodelist)[0])
            log(f"kill-node: job {job_id} runs on {self.target[2]}; killing it {self.after}s after start")
        job_id, started, node = self.target
        if time.time() < started + self.after:
            return
        self.done = True
        state = read_node_state(self.paths, node)
        killed = kill_node_processes(self.paths, state.uts_ns, grace=0.0)
        log(f"kill-node: killed {node} (job {job_id}): pids {killed}")
        # The scheduler learns at once (Slurm itself would after SlurmdTimeout); clustermgtd.py then
        # replaces the DOWN node as it replaces any unhealthy one.
        set_node_state(self.paths, [node], "DOWN", KILLED_REASON)


class SshOutageFault:
    """Stop sshd `after` seconds after `start_epoch`; start it again `duration` seconds later or, with
    `release`, only once that file exists (a test holds the outage until it has seen it).

    Reports both moments in run/faults/ssh-outage.json ({"state": "down"|"up", "down_at", "up_at"}, epoch
    seconds), written as they happen, so a watcher needs no timing of its own."""

    def __init__(self, paths: ClusterPaths, start_epoch: float, after: float, duration: float | None,
                 release: Path | None = None) -> None:
        if duration is None and release is None:
            raise ValueError("an ssh outage needs a duration or a release file")
        self.paths, self.release = paths, release
        self.down_at = start_epoch + after
        self.up_at = None if duration is None else self.down_at + duration
        self.state = "before"
        self.report: dict[str, float | str | None] = {"state": "before", "down_at": None, "up_at": None}

    @property
    def done(self) -> bool:
        return self.state == "after"

    def _report(self, **fields: float | str) -> None:
        self.report.update(fields)
        target = outage_report(self.paths)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.report))
        tmp.replace(target)

    def _over(self, now: float) -> bool:
        if self.release is not None:
            return self.release.exists()
        return self.up_at is not None and now >= self.up_at

    def step(self) -> None:
        now = time.time()
        if self.state == "before" and now >= self.down_at:
            info = read_daemons(self.paths).get("sshd", {})
            # The listener and every open session drop, as in a network outage; processes users left
            # running on the head node (nohup) survive.
            in_sshd_namespace = pids_in_namespaces({info.get("uts_ns") or 0}, self.paths.hosts_file)
            stopped = kill_pids(sorted(p for p in in_sshd_namespace if cmdline(p).startswith("sshd")), grace=1.0)
            log(f"ssh-outage: sshd {info.get('pid')} stopped with its sessions: {stopped}")
            self.state = "down"
            self._report(state="down", down_at=time.time())
        if self.state == "down" and self._over(now):
            runtime = load_runtime(self.paths)
            head = runtime["head_node"]
            launched = sshd.start_sshd(self.paths, head["hostname"], head["ip"], head["ssh_port"],
                                       runtime["mount_dirs"])
            log(f"ssh-outage: sshd restarted as {launched.pid}")
            self.state = "after"
            self._report(state="up", up_at=time.time())


def outage_report(paths: ClusterPaths) -> Path:
    return paths.run / "faults" / "ssh-outage.json"


def outage_now(cluster_dir: Path, duration: float | None, release: Path | None) -> int:
    """An ssh outage started at once (tests drive it), until `duration` passes or `release` exists."""
    fault = SshOutageFault(cluster_paths(cluster_dir), time.time(), 0.0, duration, release)
    while not fault.done:
        fault.step()
        time.sleep(0.2)
    return 0


def run(cluster_dir: Path) -> int:
    paths = cluster_paths(cluster_dir)
    runtime = load_runtime(paths)
    faults = runtime["faults"]
    active: list[KillNodeFault | SshOutageFault] = []
    if faults.get("kill_node_after") is not None:
        active.append(KillNodeFault(paths, float(faults["kill_node_after"])))
    if faults.get("ssh_outage"):
        after, duration = faults["ssh_outage"]
        active.append(SshOutageFault(paths, float(runtime["ready_at_epoch"] or time.time()), after, duration))
    log(f"agent for {runtime['cluster_name']}: {len(active)} fault(s)")
    while any(not f.done for f in active):
        if not paths.runtime_json.exists():
            return 0
        for fault in active:
            try:
                fault.step()
            except (subprocess.SubprocessError, OSError, KeyError, ValueError) as exc:
                log(f"{type(fault).__name__}: {exc!r}")
        time.sleep(POLL_S)
    log("agent: all faults done")
    return 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    parser = argparse.ArgumentParser(prog="python -m localcluster.runtime.agent")
    parser.add_argument("cluster_dir", type=Path)
    sub = parser.add_subparsers(dest="action")
    now = sub.add_parser("ssh-outage-now")
    ends = now.add_mutually_exclusive_group(required=True)
    ends.add_argument("--duration", type=float)
    ends.add_argument("--release", type=Path)
    args = parser.parse_args(argv)
    if args.action == "ssh-outage-now":
        return outage_now(args.cluster_dir, args.duration, args.release)
    return run(args.cluster_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
