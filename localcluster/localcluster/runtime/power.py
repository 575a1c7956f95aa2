"""Slurm ResumeProgram / SuspendProgram / ResumeFailProgram: power dynamic nodes up and down
(pcluster's slurm_resume / slurm_suspend), and replace a node past its bootstrap timeout.

Called by slurmctld as `python -m localcluster.runtime.power resume|suspend|resume-fail CLUSTER_DIR HOSTLIST`.
The bootstrap timeout (DevSettings.Timeouts.ComputeNodeBootstrapTimeout) is Slurm's ResumeTimeout, as
on pcluster: a node not registered by then is set DOWN by Slurm, which runs ResumeFailProgram. That
does what clustermgtd does with such a node (aws-parallelcluster-node, _handle_unhealthy_dynamic_nodes):
terminate its instance and power it down, so that Slurm may launch it again (the replacement). A boot
that would end after the timeout never starts its slurmd.
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
# clustermgtd's reason when it powers down an unhealthy dynamic node.
UNHEALTHY_REASON = "Scheduler health check failed"
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
    requested = booting.requested_at or time.time()
    timeout_s = float(runtime.get("compute_node_bootstrap_timeout") or 0)
    if timeout_s and boot_s >= timeout_s:
        # The instance never finishes bootstrapping in time: Slurm's ResumeTimeout fails it (resume_fail).
        log(paths, f"boot {name}: takes {boot_s:g}s, over the {timeout_s:g}s bootstrap timeout")
        return
    time.sleep(max(0.0, requested + boot_s - time.time()))
    now = read_node_state(paths, name)
    if now.state != "booting" or now.instance_id != booting.instance_id:
        return   # suspended, failed or torn down while booting (perhaps launched again since)
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


def resume_fail(paths: ClusterPaths, hostlist: str) -> None:
    """Nodes Slurm gave up on at ResumeTimeout: what clustermgtd does with a bootstrap failure."""
    aws = runtime_aws(load_runtime(paths))
    names = expand_hostlist(paths, hostlist)
    for name in names:
        instance_id = read_node_state(paths, name).instance_id
        log(paths, f"Node bootstrap error: Resume timeout expires for node {name} ({instance_id})")
        stop_slurmd(paths, name)
        if instance_id:
            aws.terminate_instances([instance_id])
    set_node_state(paths, names, "POWER_DOWN_FORCE", UNHEALTHY_REASON)


def main(argv: list[str]) -> int:
    clear_signal_mask()
    action, cluster_dir, arg = argv[0], Path(argv[1]), argv[2]
    paths = cluster_paths(cluster_dir)
    try:
        {"resume": resume, "suspend": suspend, "resume-fail": resume_fail, "boot": boot}[action](paths, arg)
    except Exception as exc:  # slurmctld only sees the exit code: keep the reason in our log
        log(paths, f"{action} {arg} failed: {exc!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
