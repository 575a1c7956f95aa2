"""The cluster's node plan: names, IPs and ports derived from the spec and the slot (pcluster naming)."""
from __future__ import annotations

from dataclasses import dataclass, asdict

from ..spec import ClusterSpec, node_plan
from .slots import Slot


@dataclass(frozen=True)
class ComputeNode:
    name: str            # <queue>-st-<resource>-N or <queue>-dy-<resource>-N
    number: int          # 1-based, across the whole cluster: picks the IP and port
    queue: str
    resource: str
    instance_type: str
    dynamic: bool
    ip: str
    port: int
    efa: bool = False    # the compute resource's Efa.Enabled: the instance gets its EFA devices

    def to_dict(self) -> dict:
        return asdict(self)


def head_hostname(slot: Slot) -> str:
    """pcluster head nodes are called ip-a-b-c-d after their private IP."""
    return "ip-" + slot.head_ip.replace(".", "-")


def compute_nodes(spec: ClusterSpec, slot: Slot) -> list[ComputeNode]:
    nodes: list[ComputeNode] = []
    for queue, resource, name, dynamic in node_plan(spec.queues):
        number = len(nodes) + 1
        nodes.append(ComputeNode(
            name=name, number=number, queue=queue.name, resource=resource.name,
            instance_type=resource.instance_type, dynamic=dynamic, ip=slot.compute_ip(number),
            port=slot.slurmd_port(number), efa=resource.efa))
    return nodes


def count_compute_nodes(spec: ClusterSpec) -> int:
    return sum(cr.max_count for q in spec.queues for cr in q.compute_resources)


def hosts_file_text(head_name: str, head_ip: str, nodes: list[ComputeNode]) -> str:
    lines = ["127.0.0.1\tlocalhost", f"{head_ip}\t{head_name}"]
    lines += [f"{n.ip}\t{n.name}" for n in nodes]
    return "\n".join(lines) + "\n"
