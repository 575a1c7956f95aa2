"""A compute node's EC2 instances: each boot runs on a new one, launched in moto and tagged as
ParallelCluster tags it. A replacement is a new instance under the same Slurm name; faults bound to the
old instance do not follow it (node_faults.py).

launch() is ResumeProgram's and clustermgtd's RunInstances (and provision's, for static nodes); retire()
is what terminating a node's instance does to the node: its slurmd and everything in it stop.
"""
from __future__ import annotations

import subprocess
import sys
import time

from . import node_faults
from .layout import ComputeNode
from .nodes import NodeState, read_node_state, stop_slurmd, write_node_state
from .paths import ClusterPaths
from .runtime_state import runtime_aws


def launch(paths: ClusterPaths, runtime: dict, node: ComputeNode) -> tuple[str, str]:
    """A new instance for the node: (instance id, launch time)."""
    instance_id, launch_time = runtime_aws(runtime).run_instance(
        runtime["cluster_name"], "Compute", node.instance_type, node.name, node.queue, node.resource)
    node_faults.bind_next(paths, node.name, instance_id)
    return instance_id, launch_time


def boot_in_background(paths: ClusterPaths, name: str, instance: tuple[str, str]) -> None:
    """The instance boots (power.py boot): its slurmd starts after the boot delay, unless the node is
    stopped or launched again meanwhile. The caller does not wait, as slurmctld does not for ResumeProgram."""
    instance_id, launch_time = instance
    write_node_state(paths, NodeState(name=name, state="booting", instance_id=instance_id,
                                      launch_time=launch_time, requested_at=time.time()))
    subprocess.Popen([sys.executable, "-I", "-m", "localcluster.runtime.power", "boot", str(paths.root), name],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True, cwd="/")


def retire(paths: ClusterPaths, runtime: dict, names: list[str]) -> dict[str, str | None]:
    """Terminate the nodes' instances (and so stop their slurmd and jobs); node -> instance id it had."""
    aws = runtime_aws(runtime)
    retired: dict[str, str | None] = {}
    for name in names:
        retired[name] = read_node_state(paths, name).instance_id
        stop_slurmd(paths, name)
        if retired[name]:
            aws.terminate_instances([retired[name]])
    return retired
