"""External fault actions for test_fault_matrix.py, on the shared end-to-end deployment: the head node's
Slurm as the host sees it, the head node's sshd down for a while, the triggerer killed and restarted.
Test code only: nothing here is reachable from the product."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.fixtures_localcluster import LOCALCLUSTER_PYTHON

# The `kill-node-after` knob's fault (slurmd of the job's first node and its processes killed),
# started from the test once train's job runs, so that it cannot hit parallel_compile's job instead.
_KILL_NODE = """
import sys, time
from pathlib import Path
from localcluster.runtime.agent import KillNodeFault
from localcluster.runtime.paths import ClusterPaths
fault = KillNodeFault(ClusterPaths(Path(sys.argv[1]).resolve()), float(sys.argv[2]))
deadline = time.monotonic() + 120
while not fault.done and time.monotonic() < deadline:
    fault.step()
    time.sleep(0.5)
sys.exit(0 if fault.done else 1)
"""


def cluster_dir(uc_home: Path, cluster_name: str) -> Path:
    return uc_home / "clusters" / cluster_name


def slurm(cluster: Path, *args: str) -> str:
    """A Slurm client command against that cluster's slurmctld (empty when the cluster is gone)."""
    try:
        conf = json.loads((cluster / "runtime.json").read_text())["slurm"]["conf"]
    except (OSError, ValueError, KeyError):
        return ""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(list(args), env={**env, "SLURM_CONF": conf}, capture_output=True, text=True, timeout=30)
    return done.stdout if done.returncode == 0 else ""


def jobs(cluster: Path, all_states: bool = False) -> list[dict[str, str]]:
    """The cluster's jobs as squeue lists them (with --states all: finished ones too, for MinJobAge)."""
    out = slurm(cluster, "squeue", "-h", *(["--states", "all"] if all_states else []), "-o", "%i|%T|%.300j")
    rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
    return [{"id": i.strip(), "state": s.strip(), "name": n.strip()} for i, s, n in rows]


def denied_launches(cluster: Path) -> int:
    """Node launches the insufficient-capacity fault refused, from the node manager's log (-1: gone)."""
    try:
        return (cluster / "log" / "power.log").read_text(errors="replace").count(": insufficient capacity")
    except OSError:
        return -1


def submissions(cluster: Path) -> int:
    """sbatch submissions slurmctld accepted, from its own log."""
    log = cluster / "log" / "slurmctld.log"
    try:
        return sum("_slurm_rpc_submit_batch_job" in line for line in log.read_text(errors="replace").splitlines())
    except OSError:
        return -1


def start_ssh_outage(cluster: Path, seconds: float) -> subprocess.Popen:
    """The local cluster's own outage (the `ssh-outage` knob's: sshd and its sessions stopped, restarted
    `seconds` later), started at once instead of on a timer."""
    return subprocess.Popen([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime.agent", str(cluster),
                             "ssh-outage-now", "--duration", str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_node_kill(cluster: Path, after: float) -> subprocess.Popen:
    return subprocess.Popen([str(LOCALCLUSTER_PYTHON), "-c", _KILL_NODE, str(cluster), str(after)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _component_pids(airflow_home: str, component: str) -> list[int]:
    """Processes of this deployment's component (the process and its forked children)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        argv = [a for a in argv if a]
        # `<python> .../bin/airflow <component>`, not the shell of scripts/airflow.sh that names them all.
        is_component = len(argv) >= 2 and argv[-1] == component.encode() and argv[-2].endswith(b"/airflow")
        if is_component and f"AIRFLOW_HOME={airflow_home}".encode() in environ:
            found.append(int(pid))
    return found + _descendants(found)


def _descendants(pids: list[int]) -> list[int]:
    """Children that renamed themselves (the triggerer's log server): they go with it."""
    parents: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], set(pids)
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in pids and pid not in found]
        found += children
        frontier = set(children)
    return found


def kill_component(airflow_home: str, component: str) -> tuple[list[str], dict[str, str]]:
    """SIGKILL a component of the deployment; returns its argv and environment, to restart it alike."""
    pids = _component_pids(airflow_home, component)
    assert pids, f"no {component} running for {airflow_home}"
    first = pids[0]
    argv = [a.decode() for a in Path(f"/proc/{first}/cmdline").read_bytes().split(b"\0") if a]
    environ = dict(e.decode().split("=", 1) for e in Path(f"/proc/{first}/environ").read_bytes().split(b"\0")
                   if b"=" in e)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while _component_pids(airflow_home, component):
        assert time.monotonic() < deadline, f"{component} survived SIGKILL"
        time.sleep(0.5)
    return argv, environ


def restart_component(airflow_home: str, component: str, argv: list[str], environ: dict[str, str]) -> int:
    """Start it again as scripts/airflow.sh did, in a process group that stop_airflow also ends."""
    log = open(Path(airflow_home) / "logs" / f"{component}.log", "a")
    proc = subprocess.Popen(argv, env=environ, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    with open(Path(airflow_home) / "extra-process-groups", "a") as groups:
        groups.write(f"{proc.pid}\n")
    return proc.pid
