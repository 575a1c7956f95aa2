"""The normalised cluster description shared by the CLI (which builds it from the
ParallelCluster v3 YAML) and the runtime (which turns it into daemons)."""
from __future__ import annotations

from dataclasses import dataclass, field, asdict


@dataclass(frozen=True)
class ComputeResource:
    name: str
    instance_type: str
    min_count: int
    max_count: int
    efa: bool = False


@dataclass(frozen=True)
class Queue:
    name: str
    compute_resources: tuple[ComputeResource, ...]
    capacity_type: str = "ONDEMAND"
    placement_group: bool = False


@dataclass(frozen=True)
class Faults:
    """Fault-injection knobs (docs/contracts.md); None/0 means off."""
    provisioning_delay: float = 3.0
    fail_create: str | None = None            # failureCode, e.g. OnNodeConfiguredExecutionFailure
    insufficient_capacity: tuple[str, ...] = ()  # compute resource names, or ("*",)
    kill_node_after: float | None = None      # seconds after a job starts on a node
    ssh_outage: tuple[float, float] | None = None  # (after, duration) seconds after CREATE_COMPLETE
    boot_delay: float = 2.0


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    region: str
    head_instance_type: str
    key_name: str
    queues: tuple[Queue, ...]
    mount_dirs: tuple[str, ...] = ("/fsx",)   # SharedStorage MountDir values
    accounting: bool = False                  # Scheduling.SlurmSettings.Database present
    scaledown_idletime_min: float = 10.0      # SlurmSettings.ScaledownIdletime (minutes)
    tags: tuple[tuple[str, str], ...] = ()    # caller's Tags from the config
    faults: Faults = field(default_factory=Faults)
    config_yaml: str = ""                     # the original text, kept for clusterConfiguration

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "ClusterSpec":
        queues = tuple(
            Queue(
                name=q["name"],
                capacity_type=q.get("capacity_type", "ONDEMAND"),
                placement_group=q.get("placement_group", False),
                compute_resources=tuple(ComputeResource(**cr) for cr in q["compute_resources"]),
            )
            for q in d["queues"]
        )
        f = dict(d.get("faults") or {})
        if f.get("insufficient_capacity") is not None:
            f["insufficient_capacity"] = tuple(f["insufficient_capacity"])
        if f.get("ssh_outage") is not None:
            f["ssh_outage"] = tuple(f["ssh_outage"])
        return ClusterSpec(
            name=d["name"], region=d["region"], head_instance_type=d["head_instance_type"],
            key_name=d["key_name"], queues=queues, mount_dirs=tuple(d.get("mount_dirs", ("/fsx",))),
            accounting=d.get("accounting", False),
            scaledown_idletime_min=d.get("scaledown_idletime_min", 10.0),
            tags=tuple(tuple(t) for t in d.get("tags", ())), faults=Faults(**f),
            config_yaml=d.get("config_yaml", ""),
        )
