"""The fleet wait's verdicts: is the cluster up, and can Slurm run a job of ``num_nodes`` nodes?

Pure functions over what the wait saw (describe-cluster's facts, sinfo's nodes): the trigger in the
triggerer and the sensor's worker-side poke call the same ones. Each returns a ``Judgement``:
ready, pending or failed, a reason code (the event's ``reason``) and the message a user reads.
Nodes are ``parsers.slurm.NodeStatus`` (any object with its attributes).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ultracluster.run.lost_nodes import LostNodes
from ultracluster.run.states import (
    FAILED,
    FLEET_PROTECTED,
    FLEET_RUNNING,
    GONE,
    PENDING,
    READY,
    cluster_verdict,
    fleet_verdict,
)


class Judgement(NamedTuple):
    verdict: str  # READY, PENDING or FAILED
    reason: str  # a code (run.events): what a test or a caller can match on
    message: str


def judge_cluster(*, name: str, status: str, fleet_status: str, failures: list[dict[str, Any]],
                  head_node_address: str | None) -> Judgement:
    """The cluster gate on describe-cluster's facts (``parsers.pcluster.cluster_facts``)."""
    verdict = cluster_verdict(status)
    if verdict in (FAILED, GONE):
        reasons = "; ".join(f"{f.get('failureCode', '?')}: {f.get('failureReason', '')}".strip() for f in failures)
        return Judgement(FAILED, "cluster_" + verdict,
                         f"Cluster {name} is {status}" + (f" ({reasons})" if reasons else ""))
    if verdict == PENDING:
        return Judgement(PENDING, "cluster_pending", f"cluster {name} is {status or 'in an unknown state'}")
    if fleet_status == FLEET_PROTECTED:
        return Judgement(FAILED, "fleet_protected", (
            f"Compute fleet of {name} is PROTECTED: ParallelCluster stopped launching nodes after repeated "
            "bootstrap failures (check the node logs), then set it RUNNING with update-compute-fleet"))
    if fleet_verdict(fleet_status) == FAILED:
        return Judgement(FAILED, "fleet_stopped", f"Compute fleet of {name} is {fleet_status}; start it with "
                                                  "update-compute-fleet --status START_REQUESTED")
    if fleet_status != FLEET_RUNNING:
        return Judgement(PENDING, "fleet_pending",
                         f"compute fleet of {name} is {fleet_status or 'not reported yet'}")
    if not head_node_address:
        return Judgement(PENDING, "head_node_pending", f"cluster {name} reports no head node address yet")
    return Judgement(READY, "ready", f"cluster {name} is {status}, compute fleet RUNNING")


class PartitionNotFound(ValueError):
    """sinfo shows no such partition (or no default one): waiting will not create it."""


@dataclass
class PartitionCapacity:
    """Can a partition run a job of ``wanted`` nodes now (or after powering dynamic nodes up)?"""

    partition: str
    wanted: int
    idle: list[str] = field(default_factory=list)
    powered_down: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    unusable: dict[str, str] = field(default_factory=dict)  # node -> "state: reason"
    failed: dict[str, str] = field(default_factory=dict)  # power-up failed: node -> "state: reason"
    partition_up: bool = True

    @property
    def total(self) -> int:
        """Every node of the partition, whatever its state."""
        return len(self.idle) + len(self.powered_down) + len(self.busy) + len(self.unusable) + len(self.failed)

    @property
    def available(self) -> int:
        return len(self.idle) + len(self.powered_down)

    @property
    def ready(self) -> bool:
        return self.partition_up and self.available >= self.wanted

    @property
    def impossible(self) -> bool:
        """Even once every busy node frees up, too few nodes are usable: waiting will not help."""
        return not self.partition_up or self.available + len(self.busy) < self.wanted

    def describe(self) -> str:
        text = (
            f"partition {self.partition}: need {self.wanted} node(s); idle {len(self.idle)}, "
            f"idle~ (powered down) {len(self.powered_down)}, busy {len(self.busy)}, "
            f"unusable {len(self.unusable)}" + (f", failed to power up {len(self.failed)}" if self.failed else "")
        )
        if not self.partition_up:
            text += " (partition is not up)"
        if self.unusable or self.failed:
            text += "; " + "; ".join(f"{node} {why}" for node, why in sorted({**self.unusable, **self.failed}.items()))
        return text


def partition_capacity(nodes: Iterable[Any], partition: str | None, wanted: int) -> PartitionCapacity:
    """Summarise one partition; ``partition=None`` means the default partition."""
    nodes = list(nodes)
    if partition is None:
        defaults = [n.partition for n in nodes if n.default_partition]
        if not defaults:
            raise PartitionNotFound("sinfo shows no default partition; name the queue explicitly")
        partition = defaults[0]
    members = [n for n in nodes if n.partition == partition]
    if not members:
        known = sorted({n.partition for n in nodes})
        raise PartitionNotFound(f"Partition {partition!r} not found in sinfo (partitions: {known})")
    capacity = PartitionCapacity(partition=partition, wanted=wanted)
    capacity.partition_up = all(n.available == "up" for n in members)
    for node in members:
        if node.power_up_failed:
            capacity.failed[node.name] = f"{node.state}: {node.reason}"
        elif node.is_unusable:
            capacity.unusable[node.name] = f"{node.state}: {node.reason or 'no reason given'}"
        elif node.is_idle_ready:
            capacity.idle.append(node.name)
        elif node.is_idle_powered_down:
            capacity.powered_down.append(node.name)
        else:
            capacity.busy.append(node.name)
    return capacity


def judge_capacity(capacity: PartitionCapacity, lost: LostNodes | None = None, shared: bool = False) -> Judgement:
    """Nodes whose power-up failed (a bootstrap timeout, insufficient capacity, a failed health
    check) are lost (``run.lost_nodes``): while each is within its replacements the wait waits for
    ParallelCluster to replace it; past them it fails at once, naming the node, unless the others can
    run the job. ``lost``: the task's ledger, updated in place (None: no replacements).

    ``shared``: the cluster is not the run's (a sweep's shared cluster): other jobs' nodes, powering
    down or back, come back to the queue, so too few usable nodes now is a wait ("nodes_held") as
    long as the partition has enough nodes at all."""
    lost = LostNodes(limit=0) if lost is None else lost
    lost.observe(capacity.failed, [*capacity.idle, *capacity.powered_down, *capacity.busy])
    if capacity.ready:
        return Judgement(READY, "ready", capacity.describe())
    if capacity.failed and lost.past:
        return Judgement(FAILED, "node_lost", f"{lost.failure()}. {capacity.describe()}")
    # Nodes the task lost (drained by the health gate, down after a node fault) are being replaced
    # whatever Slurm's reason says meanwhile.
    replacing = lost.replacing([*capacity.failed, *(n for n in capacity.unusable if n in lost.failing)])
    if not capacity.partition_up or capacity.available + len(capacity.busy) + len(replacing) < capacity.wanted:
        if shared and capacity.partition_up and capacity.total >= capacity.wanted:
            return Judgement(PENDING, "nodes_held", "waiting for nodes other jobs hold or release: "
                             + capacity.describe())
        return Judgement(FAILED, "not_enough_nodes", "Not enough usable nodes: " + capacity.describe())
    if replacing:
        return Judgement(PENDING, "nodes_replacing", (
            f"waiting for ParallelCluster to replace lost node(s) (losses/allowed: {lost.describe()}): "
            + capacity.describe()))
    if shared and capacity.busy:
        return Judgement(PENDING, "nodes_held", "waiting for nodes other jobs hold: " + capacity.describe())
    return Judgement(PENDING, "nodes_pending", capacity.describe())


def stuck_nodes(capacity: PartitionCapacity, since: dict[str, float], now: float, after_s: float) -> list[str]:
    """Unusable nodes (down, not responding, drained) seen unusable at every check for ``after_s``;
    ``since`` (node -> first seen) is updated in place."""
    for node in list(since):
        if node not in capacity.unusable:
            del since[node]
    for node in capacity.unusable:
        since.setdefault(node, now)
    return sorted(node for node, first in since.items() if now - first >= after_s)


def judge_nodes(nodes: Iterable[Any], partition: str | None, wanted: int, *, since: dict[str, float],
                now: float, stuck_after_s: float, lost: LostNodes | None = None, shared: bool = False,
                ) -> tuple[Judgement, PartitionCapacity | None]:
    """The Slurm gate on one sinfo: capacity and the lost-node rule (``lost``: the ledger, updated in
    place), then the stuck-node rule (``since`` carries its clock); ``shared`` as ``judge_capacity``."""
    try:
        capacity = partition_capacity(nodes, partition, wanted)
    except PartitionNotFound as err:
        return Judgement(FAILED, "partition_not_found", str(err)), None
    judgement = judge_capacity(capacity, lost, shared)
    stuck = stuck_nodes(capacity, since, now, stuck_after_s)
    if judgement.verdict == PENDING and stuck:
        return Judgement(FAILED, "nodes_stuck", (
            f"Nodes stayed down, drained or not responding for {stuck_after_s:.0f}s: "
            + "; ".join(f"{n} ({capacity.unusable[n]})" for n in stuck) + f". {judgement.message}")), capacity
    return judgement, capacity
