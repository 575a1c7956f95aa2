"""set_compute_fleet(): pcluster update-compute-fleet for the local cluster."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .nodes import node_is_up, start_slurmd, stop_slurmd
from .runtime_state import cluster_paths, fleet_lock, load_runtime, runtime_nodes, save_runtime
from .slurmcmd import set_node_state, slurm, wait_nodes_state

FLEET_STOPPED_REASON = "Compute fleet stopped"
POWER_DOWN_TIMEOUT_S = 60.0


def _set_status(cluster_dir: Path, status: str) -> dict:
    paths = cluster_paths(cluster_dir)
    with fleet_lock(paths):
        runtime = load_runtime(paths)
        runtime["compute_fleet_status"] = status
        save_runtime(paths, runtime)
    return runtime


def _set_partitions(cluster_dir: Path, runtime: dict, state: str) -> None:
    paths = cluster_paths(cluster_dir)
    for queue in sorted({n["queue"] for n in runtime["nodes"]}):
        slurm(paths, "scontrol", "update", f"partitionname={queue}", f"state={state}")


def _stop(cluster_dir: Path) -> str:
    paths = cluster_paths(cluster_dir)
    runtime = _set_status(cluster_dir, "STOPPING")
    _set_partitions(cluster_dir, runtime, "INACTIVE")
    nodes = runtime_nodes(runtime)
    dynamic_up = [n.name for n in nodes if n.dynamic and node_is_up(paths, n.name)]
    if dynamic_up:
        # slurmctld runs SuspendProgram for these, as for any power-down.
        set_node_state(paths, dynamic_up, "POWER_DOWN_FORCE")
    static = [n.name for n in nodes if not n.dynamic]
    if static:
        set_node_state(paths, static, "DOWN", FLEET_STOPPED_REASON)
        for name in static:
            stop_slurmd(paths, name)
    deadline = time.monotonic() + POWER_DOWN_TIMEOUT_S
    while time.monotonic() < deadline and any(node_is_up(paths, n) for n in dynamic_up):
        time.sleep(0.2)
    for name in dynamic_up:   # SuspendProgram did not run in time: stop them ourselves
        if node_is_up(paths, name):
            stop_slurmd(paths, name)
    _set_status(cluster_dir, "STOPPED")
    return "STOPPED"


def _start(cluster_dir: Path) -> str:
    paths = cluster_paths(cluster_dir)
    runtime = _set_status(cluster_dir, "STARTING")
    static = [n.name for n in runtime_nodes(runtime) if not n.dynamic]
    for name in static:
        if not node_is_up(paths, name):
            start_slurmd(paths, name, runtime["mount_dirs"], fresh_boot=False)
    if static and not wait_nodes_state(paths, static, {"idle", "alloc", "mix"}, 10):
        try:
            set_node_state(paths, static, "RESUME")
        except subprocess.CalledProcessError:
            pass   # already back in service
        wait_nodes_state(paths, static, {"idle", "alloc", "mix"}, 30)
    _set_partitions(cluster_dir, runtime, "UP")
    _set_status(cluster_dir, "RUNNING")
    return "RUNNING"


def set_compute_fleet(cluster_dir: Path, status: str) -> str:
    if status == "STOP_REQUESTED":
        return _stop(cluster_dir)
    if status == "START_REQUESTED":
        return _start(cluster_dir)
    raise ValueError(f"unsupported compute fleet status request {status!r}")
