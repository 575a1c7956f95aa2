"""clustermgtd, the head node's cluster manager, as ParallelCluster runs it (aws-parallelcluster-node:
src/slurm_plugin/clustermgtd.py, slurm_resources.py): each loop it reads the nodes from the scheduler and
replaces those Slurm reports DRAINED or DOWN outside power saving (terminate_drain_nodes and
terminate_down_nodes, both on by default):
- a dynamic node: its instance is terminated and the node powered down (`power_down_force`, reason
  "Scheduler health check failed"), so the next job that needs it launches a new instance
  (_handle_unhealthy_dynamic_nodes); this includes a node Slurm set DOWN at ResumeTimeout, a bootstrap
  failure (ResumeFailProgram, power.py, only logs, as pcluster's slurm_suspend does);
- a static node: set DOWN ("Static node maintenance: unhealthy node is being replaced"), its instance
  terminated and a new one launched; left alone while it boots, until its bootstrap resumes it
  (_handle_unhealthy_static_nodes; power.py boot).
A dynamic node that failed to launch for want of capacity ((Code:InsufficientInstanceCapacity)...) is
held instead (_handle_ice_nodes): its compute resource is disabled from the loop that first sees it (its
powered-down nodes set DOWN, "(Code:<code>)Temporarily disabling node due to insufficient capacity"), and
once insufficient_capacity_timeout (600 s; the `insufficient-capacity-timeout` knob here) has passed, its
capacity-failed nodes are powered down ("Enabling node since insufficient capacity timeout expired"), back
to idle~, so that the next job launches them again. A timeout of 0 turns the hold off: they are replaced
as any unhealthy dynamic node. It acts only while the compute fleet is RUNNING.

Local differences (docs/local-cluster.md, Fidelity): a loop every 2 s (the real LOOP_TIME is 60 s);
nodes are judged by the scheduler's state only (no EC2 health checks, scheduled events, missing
instances or replacement timeout; the kill-node fault sets its node DOWN itself); no protected mode.
Its log, in the real one's format, is the head node's `clustermgtd` stream (what the CloudWatch agent
ships from /var/log/parallelcluster/clustermgtd), with the lines the real one writes when it acts, not
its routine ones.

Run as `python -m localcluster.runtime.clustermgtd CLUSTER_DIR` (provision starts it, teardown stops it).
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .. import cluster_logs
from . import instances
from .paths import ClusterPaths
from .runtime_state import cluster_paths, fleet_lock, load_runtime, runtime_nodes
from .slurmcmd import set_node_state, slurm

LOOP_S = 2.0
LOG_STREAM = "clustermgtd"
DYNAMIC_REASON = "Scheduler health check failed"
STATIC_REASON = "Static node maintenance: unhealthy node is being replaced"
# slurm_resources.py: SlurmNode.EC2_ICE_ERROR_CODES, read from a reason "(Code:<code>)...".
ICE_CODES = {"InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity",
             "MaxSpotInstanceCountExceeded", "Unsupported", "SpotMaxPriceTooLow"}
ICE_DISABLE_REASON = "(Code:{code})Temporarily disabling node due to insufficient capacity"
ICE_RESET_REASON = "Enabling node since insufficient capacity timeout expired"
DEFAULT_INSUFFICIENT_CAPACITY_TIMEOUT_S = 600.0  # ClustermgtdConfig's insufficient_capacity_timeout
RESUME_FAILED_STATE = frozenset({"DOWN", "CLOUD", "POWERED_DOWN", "NOT_RESPONDING"})
_FIELD = re.compile(r"(?:^| )(NodeName|NodeAddr|State)=(\S+)")
_REASON = re.compile(r" Reason=(.*?)(?: \[[^\]]*\])?$")


@dataclass(frozen=True)
class SchedulerNode:
    """One node of `scontrol show nodes`, judged as slurm_resources.SlurmNode judges it."""
    name: str
    addr: str
    state_string: str
    reason: str

    @property
    def states(self) -> set[str]:
        return set(self.state_string.split("+"))

    def __str__(self) -> str:
        return f"{self.name}({self.addr})"

    @property
    def is_down(self) -> bool:
        return "DOWN" in self.states and "POWERING_DOWN" not in self.states

    @property
    def is_drained(self) -> bool:
        """sinfo's `drained`: DRAIN, not powering down, and idle or down (a draining node still runs its job)."""
        states = self.states
        return "DRAIN" in states and "POWER_DOWN" not in states and ("IDLE" in states or self.is_down)

    @property
    def is_up(self) -> bool:
        return "DRAIN" not in self.states and not self.is_down and "POWERING_DOWN" not in self.states

    @property
    def error_code(self) -> str:
        return self.reason[len("(Code:"):].split(")")[0] if self.reason.startswith("(Code:") else ""

    @property
    def is_ice(self) -> bool:
        return self.error_code in ICE_CODES

    @property
    def is_powered_down(self) -> bool:
        """SlurmNode.is_power(): a dynamic node in power saving, no instance behind it."""
        return self.states - {"POWER_DOWN"} == {"IDLE", "CLOUD", "POWERED_DOWN"}


def scheduler_nodes(paths: ClusterPaths) -> list[SchedulerNode]:
    nodes = []
    for line in slurm(paths, "scontrol", "-o", "show", "nodes", timeout=30).splitlines():
        fields = dict(_FIELD.findall(line))
        reason = _REASON.search(line)
        if "NodeName" in fields and "State" in fields:
            nodes.append(SchedulerNode(fields["NodeName"], fields.get("NodeAddr", fields["NodeName"]),
                                       fields["State"], reason.group(1) if reason else ""))
    return nodes


def print_with_count(items: list) -> str:
    """slurm_plugin/common.py's rendering of a list in log lines."""
    return f"(x{len(items)}) {[str(i) for i in items]}"


def log_stream(paths: ClusterPaths) -> Path:
    """The head node's clustermgtd log (its CloudWatch stream)."""
    head = load_runtime(paths)["head_node"]
    return cluster_logs.stream_path(paths.root, head["hostname"], head["instance_id"], LOG_STREAM)


class ClusterManager:
    def __init__(self, paths: ClusterPaths) -> None:
        self.paths = paths
        self.stream = log_stream(paths)
        self.static_nodes_in_replacement: set[str] = set()
        # (queue, compute resource) -> (first seen, error code): the capacity-failed resources held.
        self.insufficient_capacity: dict[tuple[str, str], tuple[float, str]] = {}

    def log(self, level: str, where: str, message: str) -> None:
        """A line as parallelcluster_clustermgtd_logging.conf formats it: asctime - [logger:func] - LEVEL - msg."""
        now = datetime.now(UTC)
        line = f"{now:%Y-%m-%d %H:%M:%S},{now.microsecond // 1000:03d} - [{where}] - {level} - {message}"
        self.stream.parent.mkdir(parents=True, exist_ok=True)
        with open(self.stream, "a") as out:
            out.write(line + "\n")

    def manage_cluster(self) -> None:
        with fleet_lock(self.paths):
            runtime = load_runtime(self.paths)
            if runtime["compute_fleet_status"] != "RUNNING":
                return
            by_name = {n.name: n for n in runtime_nodes(runtime)}
            dynamic = {name: node.dynamic for name, node in by_name.items()}
            active = [n for n in scheduler_nodes(self.paths) if n.name in dynamic]
            hold_s = float(runtime["faults"].get("insufficient_capacity_timeout",
                                                 DEFAULT_INSUFFICIENT_CAPACITY_TIMEOUT_S) or 0)
            # A static node stays in replacement until it is up again (_update_static_nodes_in_replacement).
            self.static_nodes_in_replacement = {n.name for n in active
                                                if n.name in self.static_nodes_in_replacement and not n.is_up}
            unhealthy = [n for n in active if self._is_unhealthy(n, dynamic[n.name], hold_s > 0)]
            unhealthy_dynamic = [n for n in unhealthy if dynamic[n.name]]
            unhealthy_static = [n for n in unhealthy if not dynamic[n.name]]
            if unhealthy_dynamic:
                self.log("INFO", "slurm_plugin.clustermgtd:_maintain_nodes",
                         f"Found the following unhealthy dynamic nodes: {print_with_count(unhealthy_dynamic)}")
                self._handle_unhealthy_dynamic_nodes(runtime, unhealthy_dynamic)
            if unhealthy_static:
                self.log("INFO", "slurm_plugin.clustermgtd:_maintain_nodes",
                         f"Found the following unhealthy static nodes: {print_with_count(unhealthy_static)}")
                self._handle_unhealthy_static_nodes(runtime, unhealthy_static)
            if hold_s > 0:
                self._handle_ice_nodes(active, by_name, hold_s)

    def _is_unhealthy(self, node: SchedulerNode, dynamic: bool, hold_ice: bool) -> bool:
        if not (node.is_drained or node.is_down):
            return False
        if (dynamic and hold_ice and node.is_ice) or (not dynamic and node.name in self.static_nodes_in_replacement):
            return False
        where = "slurm_plugin.slurm_resources:is_state_healthy"
        state = "DRAINED" if node.is_drained else "DOWN"
        self.log("WARNING", where, f"Node state check: node {node} in {state}, node state: {node.state_string}")
        if dynamic and node.states == RESUME_FAILED_STATE:
            self.log("WARNING", "slurm_plugin.slurm_resources:is_bootstrap_failure",
                     f"Node bootstrap error: Resume timeout expires for node {node}, node state: {node.state_string}")
        return True

    def _handle_unhealthy_dynamic_nodes(self, runtime: dict, nodes: list[SchedulerNode]) -> None:
        where = "slurm_plugin.clustermgtd:_handle_unhealthy_dynamic_nodes"
        names = [n.name for n in nodes]
        if any(instances.retire(self.paths, runtime, names).values()):
            self.log("INFO", where, "Terminating instances that are backing unhealthy dynamic nodes")
        self.log("INFO", where, "Setting unhealthy dynamic nodes to down and power_down.")
        set_node_state(self.paths, names, "POWER_DOWN_FORCE", DYNAMIC_REASON)

    def _handle_ice_nodes(self, active: list[SchedulerNode], by_name: dict, hold_s: float) -> None:
        """Hold the compute resources whose launches failed for want of capacity, then let them launch
        again (_update_insufficient_capacity_compute_resources, _reset_timeout_expired_compute_resources,
        _set_ice_compute_resources_to_down)."""
        now = time.monotonic()
        resource = {n.name: (by_name[n.name].queue, by_name[n.name].resource) for n in active}
        ice = [n for n in active if by_name[n.name].dynamic and (n.is_down or n.is_drained) and n.is_ice]
        for node in ice:
            self.insufficient_capacity.setdefault(resource[node.name], (now, node.error_code))
        if self.insufficient_capacity:
            held = {f"{q}/{r}": code for (q, r), (_, code) in sorted(self.insufficient_capacity.items())}
            self.log("INFO", "slurm_plugin.clustermgtd:_reset_timeout_expired_compute_resources",
                     f"The following compute resources are in down state due to insufficient capacity: {held}, "
                     f"compute resources will be reset after insufficient capacity timeout ({hold_s:g} seconds) "
                     "expired. Check the slurm_resume log for EC2 error codes.")
        expired = {key for key, (since, _) in self.insufficient_capacity.items() if now - since >= hold_s}
        for key in expired:
            del self.insufficient_capacity[key]
        reset = [n.name for n in ice if resource[n.name] in expired]
        if reset:
            self.log("INFO", "slurm_plugin.clustermgtd:_reset_insufficient_capacity_timeout_expired_nodes",
                     "Reset the following compute resources because insufficient capacity timeout expired: "
                     f"{sorted(f'{q}/{r}' for q, r in expired)}")
            set_node_state(self.paths, reset, "POWER_DOWN_FORCE", ICE_RESET_REASON)
        disable: dict[str, list[str]] = {}
        for node in active:
            held = self.insufficient_capacity.get(resource[node.name])
            if held and by_name[node.name].dynamic and node.is_powered_down:
                disable.setdefault(held[1], []).append(node.name)
        for code, names in disable.items():
            set_node_state(self.paths, names, "DOWN", ICE_DISABLE_REASON.format(code=code))

    def _handle_unhealthy_static_nodes(self, runtime: dict, nodes: list[SchedulerNode]) -> None:
        where = "slurm_plugin.clustermgtd:_handle_unhealthy_static_nodes"
        names = [n.name for n in nodes]
        self.log("INFO", where, "Setting unhealthy static nodes to DOWN")
        try:
            set_node_state(self.paths, names, "DOWN", STATIC_REASON)
        except subprocess.CalledProcessError as error:
            self.log("ERROR", where, "Encountered exception when setting unhealthy static nodes into down state: "
                                     f"{error.stderr.strip()}")
        if any(instances.retire(self.paths, runtime, names).values()):
            self.log("INFO", where, "Terminating instances backing unhealthy static nodes")
        self.log("INFO", where, "Launching new instances for unhealthy static nodes")
        by_name = {n.name: n for n in runtime_nodes(runtime)}
        for name in names:
            instances.boot_in_background(self.paths, name, instances.launch(self.paths, runtime, by_name[name]))
        self.static_nodes_in_replacement |= set(names)
        self.log("INFO", where, "After node maintenance, following nodes are currently in replacement: "
                                f"{print_with_count(sorted(self.static_nodes_in_replacement))}")


def run(cluster_dir: Path) -> int:
    paths = cluster_paths(cluster_dir)
    manager = ClusterManager(paths)
    manager.log("INFO", "slurm_plugin.clustermgtd:main", "ClusterManager Startup")
    while paths.runtime_json.exists():
        try:
            manager.manage_cluster()
        except Exception as error:  # noqa: BLE001 - as the real loop: log it, try again next time

            manager.log("ERROR", "slurm_plugin.clustermgtd:manage_cluster",
                        f"Failed when managing the cluster with exception {type(error).__name__}, message: {error}")
        time.sleep(LOOP_S)
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    sys.exit(run(Path(sys.argv[1])))
