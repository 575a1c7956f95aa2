"""Slurm ResumeProgram / SuspendProgram / ResumeFailProgram: power dynamic nodes up and down
(pcluster's slurm_resume / slurm_suspend), and an instance's boot.

Called by slurmctld as `python -m localcluster.runtime.power resume|suspend|resume-fail CLUSTER_DIR HOSTLIST`.
The bootstrap timeout (DevSettings.Timeouts.ComputeNodeBootstrapTimeout) is Slurm's ResumeTimeout, as
on pcluster: a node not registered by then is set DOWN by Slurm, which runs ResumeFailProgram; that only
logs (pcluster's is slurm_suspend), and clustermgtd.py terminates the node's instance and powers it down,
so that Slurm may launch it again (the replacement). A boot that would end after the timeout never
starts its slurmd.
"""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from . import instances
from .nodes import read_node_state, start_slurmd, utc_now_iso
from .paths import ClusterPaths
from .runtime_state import cluster_paths, find_node, load_runtime
from .slurmcmd import expand_hostlist, set_node_state, slurm

ICE_REASON = "(Code:InsufficientInstanceCapacity)Failure when resuming nodes"
# The cookbook's compute-node bootstrap resumes a static node once its slurmd runs (execute 'resume_node':
# "Always try to resume a static node on start up"), clearing a replaced node's DOWN and DRAIN.
START_UP_REASON = "Node start up"
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
    for name in names:
        if name in denied:
            continue
        instance = instances.launch(paths, runtime, find_node(runtime, name))
        log(paths, f"resume {name}: booting {instance[0]}")
        instances.boot_in_background(paths, name, instance)


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
    if not find_node(runtime, name).dynamic:
        # Fails when the node is already up (a first boot): ignored, as the cookbook does.
        slurm(paths, "scontrol", "update", f"nodename={name}", "state=resume", f"reason={START_UP_REASON}",
              check=False)


def suspend(paths: ClusterPaths, hostlist: str) -> None:
    runtime = load_runtime(paths)
    for name, instance_id in instances.retire(paths, runtime, expand_hostlist(paths, hostlist)).items():
        log(paths, f"suspend {name}: stopped, terminated {instance_id}")


def resume_fail(paths: ClusterPaths, hostlist: str) -> None:
    """Nodes Slurm gave up on at ResumeTimeout: left DOWN for clustermgtd to replace; recorded here with
    the instance that failed to boot (tests count these lines)."""
    for name in expand_hostlist(paths, hostlist):
        instance_id = read_node_state(paths, name).instance_id
        log(paths, f"Node bootstrap error: Resume timeout expires for node {name} ({instance_id})")


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
