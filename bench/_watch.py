"""Keeps what the local cluster records inside a cluster's directory, which goes with the cluster.

A thread reads every cluster dir of a deployment's home every ``period`` seconds and keeps:
- cluster.json's status transitions, each with the cluster's own time for it (lastUpdatedTime /
  lastStatusUpdatedTime) — CREATE_COMPLETE is the moment the nodes are usable;
- the latest Slurm job completion log (log/jobcomp.log: Slurm's own submit/start/end times);
- the head node sshd's "Accepted publickey" lines, stamped with the time this thread first saw them
  (sshd -E writes no timestamps): resolution ``period``.
The durable records (logs/clusters.jsonl, logs/pcluster-calls.jsonl, logs/moto.log) are read at the
end instead.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path


class ClusterWatch:
    def __init__(self, home: Path, period: float = 0.25) -> None:
        self.home, self.period = home, period
        self.status: dict[str, list[dict]] = {}     # name -> [{"status", "time", "seen"}]
        self.jobcomp: dict[str, str] = {}           # name -> text
        self.ssh_accepted: dict[str, list[float]] = {}  # name -> times first seen
        self._ssh_lines: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cluster-watch", daemon=True)

    def __enter__(self) -> "ClusterWatch":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            root = self.home / "clusters"
            for cluster in (root.iterdir() if root.is_dir() else ()):
                try:
                    self._read(cluster, now)
                except (OSError, ValueError):
                    pass  # a cluster being created or deleted right now: read it next time
            self._stop.wait(self.period)

    def _read(self, cluster: Path, now: float) -> None:
        name = cluster.name
        state = json.loads((cluster / "cluster.json").read_text())
        status = state.get("cloudFormationStackStatus")
        seen = self.status.setdefault(name, [])
        if not seen or seen[-1]["status"] != status:
            when = state.get("lastStatusUpdatedTime") if status == "CREATE_COMPLETE" else state.get("lastUpdatedTime")
            seen.append({"status": status, "time": when, "seen": now})
        comp = cluster / "log" / "jobcomp.log"
        if comp.exists():
            self.jobcomp[name] = comp.read_text()
        sshd = cluster / "log" / "sshd.log"
        if sshd.exists():
            text = sshd.read_text(errors="replace")
            lines = text[:text.rfind("\n") + 1].splitlines()  # whole lines only
            done = self._ssh_lines.get(name, 0)
            fresh = [line for line in lines[done:] if line.startswith("Accepted publickey")]
            self.ssh_accepted.setdefault(name, []).extend([now] * len(fresh))
            self._ssh_lines[name] = len(lines)
