"""Slurm ResumeProgram / SuspendProgram: power dynamic nodes up and down (pcluster's resume/suspend).

Called by slurmctld as `python -m localcluster.runtime.power resume|suspend CLUSTER_DIR HOSTLIST`.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from .nodes import NodeState, read_node_state, start_slurmd, stop_slurmd, utc_now_iso, write_node_state
from .paths import ClusterPaths
from .runtime_state import cluster_paths, find_node, load_runtime, runtime_aws
from .slurmcmd import expand_hostlist, set_node_state

ICE_REASON = "(Code:InsufficientInstanceCapacity)Failure when resuming nodes"
# slurmctld ignores a resumed node whose boot time (whole seconds) is not after the power-up request,
# and a time namespace cannot make uptime start below its current fraction: boot at least this late.
MIN_BOOT_S = 2.0


def clear_signal_mask() -> None:
    # slurmctld starts us with signals blocked; a slurmd inheriting that mask never registers.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def capacity_denied(runtime: dict, resource: str) -> bool:
    denied = runtime["faults"].get("insufficient_capacity") or []
    return "*" in denied or resource in denied


def log(paths: ClusterPaths, message: str) -> None:
    with open(paths.logs / "power.log", "a") as out:
        out.write(f"{utc_now_iso()} {message}\n")


def resume(paths: ClusterPaths, hostlist: str) -> None:
    runtime = load_runtime(paths)
    names = expand_hostlist(paths, hostlist)
    denied = [n for n in names if capacity_denied(runtime, find_node(runtime, n).resource)]
    if denied:
        log(paths, f"resume {','.join(denied)}: insufficient capacity")
        set_node_state(paths, denied, "DOWN", ICE_REASON)
    aws = runtime_aws(runtime)
    for name in names:
        if name in denied:
            continue
        node = find_node(runtime, name)
        instance_id, launch_time = aws.run_instance(runtime["cluster_name"], "Compute", node.instance_type, name,
                                                    node.queue, node.resource)
        log(paths, f"resume {name}: booting {instance_id}")
        write_node_state(paths, NodeState(name=name, state="booting", instance_id=instance_id,
                                          launch_time=launch_time, requested_at=time.time()))
        # Boot in the background: slurmctld waits for ResumeProgram, not for the node.
        subprocess.Popen([sys.executable, "-I", "-m", "localcluster.runtime.power", "boot", str(paths.root), name],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True, cwd="/")


def boot(paths: ClusterPaths, name: str) -> None:
    runtime = load_runtime(paths)
    booting = read_node_state(paths, name)
    boot_s = max(float(runtime["faults"].get("boot_delay") or 0), MIN_BOOT_S)
    time.sleep(max(0.0, (booting.requested_at or time.time()) + boot_s - time.time()))
    if read_node_state(paths, name).state != "booting":
        return   # suspended or torn down while booting
    state = start_slurmd(paths, name, runtime["mount_dirs"], fresh_boot=True,
                         instance=(booting.instance_id, booting.launch_time) if booting.instance_id else None)
    log(paths, f"boot {name}: slurmd pid {state.pid}")


def suspend(paths: ClusterPaths, hostlist: str) -> None:
    aws = runtime_aws(load_runtime(paths))
    for name in expand_hostlist(paths, hostlist):
        instance_id = read_node_state(paths, name).instance_id
        stopped = stop_slurmd(paths, name)
        if instance_id:
            aws.terminate_instances([instance_id])
        log(paths, f"suspend {name}: stopped {stopped}, terminated {instance_id}")


def main(argv: list[str]) -> int:
    clear_signal_mask()
    action, cluster_dir, arg = argv[0], Path(argv[1]), argv[2]
    paths = cluster_paths(cluster_dir)
    try:
        {"resume": resume, "suspend": suspend, "boot": boot}[action](paths, arg)
    except Exception as exc:  # slurmctld only sees the exit code: keep the reason in our log
        log(paths, f"{action} {arg} failed: {exc!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
