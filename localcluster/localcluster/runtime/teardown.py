"""teardown() and stop_everything(): stop daemons by PID, sweep their namespaces, free the slot."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from . import accounting
from .nodes import all_node_states, read_daemons, NodeState, write_node_state
from .paths import ClusterPaths
from .procs import (cmdline, kill_pids, pid_alive, pids_in_namespaces, pids_mentioning,
                    tcp_listening)
from .runtime_state import cluster_paths, load_runtime
from .slots import free_slot
from .slurmcmd import slurm

# Order matters: clustermgtd, the agent and slurmctld first, so nothing replaces, restarts or resumes
# nodes meanwhile.
DAEMON_ORDER = ("clustermgtd", "agent", "slurmctld", "sshd", "slurmdbd", "munged")


def _cancel_all_jobs(paths: ClusterPaths) -> None:
    pid = read_daemons(paths).get("slurmctld", {}).get("pid")
    if not pid or not pid_alive(pid) or not paths.slurm_conf.exists():
        return
    try:
        job_ids = slurm(paths, "squeue", "-h", "-o", "%i", timeout=10).split()
        if job_ids:
            slurm(paths, "scancel", "--quiet", *job_ids, timeout=10, check=False)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and slurm(paths, "squeue", "-h", "-o", "%i", "-t", "R,CG",
                                                        timeout=10, check=False).split():
                time.sleep(0.2)
    except (subprocess.SubprocessError, OSError):
        pass   # slurmctld unresponsive: the sweep below stops the jobs anyway


def stop_cluster_processes(paths: ClusterPaths) -> list[str]:
    """Stop every process of the cluster; returns descriptions of what was running."""
    stopped: list[str] = []
    if not paths.root.exists():
        return stopped
    _cancel_all_jobs(paths)
    daemons = read_daemons(paths)
    namespaces: set[int] = set()
    for name in DAEMON_ORDER:
        info = daemons.get(name)
        if not info:
            continue
        namespaces.update(ns for ns in [info.get("uts_ns"), *info.get("retired_uts_ns", [])] if ns)
        # Kill by PID, but only if that PID is still ours (PIDs get reused).
        pid = info["pid"]
        if pid_alive(pid) and str(paths.root) in cmdline(pid):
            stopped += [f"{name}[{p}]" for p in kill_pids([pid])]
    for node in all_node_states(paths):
        if node.uts_ns:
            namespaces.add(node.uts_ns)
        if node.pid and pid_alive(node.pid) and str(paths.root) in cmdline(node.pid):
            stopped += [f"slurmd {node.name}[{p}]" for p in kill_pids([node.pid])]
        write_node_state(paths, NodeState(name=node.name, state="stopped"))
    # Sweep: job steps and ssh sessions live in the nodes' namespaces; booters and helpers name the dir.
    return stopped + sweep(lambda: set(pids_in_namespaces(namespaces, paths.hosts_file))
                           | set(pids_mentioning(str(paths.root))))


def sweep(find: Callable[[], set[int]], rounds: int = 6, quiet_s: float = 0.3) -> list[str]:
    """Kill what ``find`` returns until it finds nothing twice, ``quiet_s`` apart: a process killed
    mid-way (a node's booter) may have started a child (its scontrol) that the last look missed."""
    stopped: list[str] = []
    for _ in range(rounds):
        leftovers = find()
        if not leftovers:
            time.sleep(quiet_s)
            if not (leftovers := find()):
                break
        leaders = _group_leaders(leftovers)
        stopped += [f"process[{p}]" for p in kill_pids(sorted(leftovers), grace=1.0)]
        for group in leaders:  # a booter's scontrol, orphaned by its TERM, is still in its group
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return stopped


def _group_leaders(pids: set[int]) -> list[int]:
    """The PIDs that lead a process group of their own (started with a new session), never ours."""
    own = os.getpgid(0)
    leaders = []
    for pid in pids:
        try:
            if os.getpgid(pid) == pid != own:
                leaders.append(pid)
        except ProcessLookupError:
            pass
    return leaders


def _listening_leftovers(paths: ClusterPaths) -> list[str]:
    try:
        runtime = load_runtime(paths)
    except (OSError, ValueError):
        return []
    head_ip = runtime["head_node"]["ip"]
    checks = [("127.0.0.1", runtime["slurm"]["slurmctld_port"]), (head_ip, runtime["head_node"]["ssh_port"])]
    if runtime["slurm"].get("slurmdbd_port"):
        checks.append(("127.0.0.1", runtime["slurm"]["slurmdbd_port"]))
    checks += [("127.0.0.1", port) for port in runtime["slurm"]["slurmd_ports"].values()]
    return [f"{host}:{port}" for host, port in checks if tcp_listening(host, port)]


def release_cluster(paths: ClusterPaths, cluster_name: str) -> None:
    """Free what outlives the processes: the slot claim and the accounting database."""
    free_slot(paths.home, cluster_name)
    try:
        accounting.drop_cluster_database(paths.home, cluster_name)
    except Exception:
        pass   # the database server is shared; a missing one has nothing to drop


def _cluster_name(paths: ClusterPaths) -> str:
    for source in (paths.runtime_json, paths.spec_json):
        try:
            doc = json.loads(source.read_text())
            return doc.get("cluster_name") or doc["name"]
        except (OSError, ValueError, KeyError):
            continue
    return paths.root.name


def teardown(cluster_dir: Path) -> None:
    paths = cluster_paths(cluster_dir)
    name = _cluster_name(paths)
    if paths.root.exists():
        stop_cluster_processes(paths)
        still = _listening_leftovers(paths)
        if still:
            raise RuntimeError(f"cluster {name}: still listening after stop: {', '.join(still)}")
    release_cluster(paths, name)
    shutil.rmtree(paths.short_run, ignore_errors=True)
    shutil.rmtree(paths.root, ignore_errors=True)
    if paths.root.exists():
        raise RuntimeError(f"could not remove {paths.root}")


def stop_everything(home: Path) -> list[str]:
    home = Path(home).resolve()
    stopped: list[str] = []
    clusters = home / "clusters"
    if clusters.is_dir():
        for cluster_dir in sorted(p for p in clusters.iterdir() if p.is_dir()):
            paths = ClusterPaths(cluster_dir)
            stopped += [f"{cluster_dir.name}: {s}" for s in stop_cluster_processes(paths)]
            shutil.rmtree(paths.short_run, ignore_errors=True)
    stopped += accounting.stop_mariadb(home)
    stopped += sweep(lambda: set(pids_mentioning(str(home))))
    return stopped


