"""The normalised cluster description shared by the CLI (which builds it from the
ParallelCluster v3 YAML) and the runtime (which turns it into daemons)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, asdict

# aws-parallelcluster 3.16.1: pcluster/constants.py OS_MAPPING (the OS's default user: the SSH user).
OS_DEFAULT_USER = {"alinux2023": "ec2-user", "ubuntu2204": "ubuntu", "ubuntu2404": "ubuntu", "rhel8": "ec2-user",
                   "rocky8": "rocky", "rhel9": "ec2-user", "rocky9": "rocky",
                   "ubuntu2004": "ubuntu", "alinux2": "ec2-user", "centos7": "centos"}  # retired: warned (README)


def default_user(image_os: str) -> str:
    return OS_DEFAULT_USER[image_os]   # Image.Os is validated against the same list (config_schema.py)


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


def node_plan(queues: Sequence[Queue]) -> Iterator[tuple[Queue, ComputeResource, str, bool]]:
    """(queue, resource, node name, dynamic) in slurm.conf order, named as pcluster names them:
    <queue>-st-<resource>-N for MinCount, then <queue>-dy-<resource>-N up to MaxCount."""
    for queue in queues:
        for resource in queue.compute_resources:
            for n in range(1, resource.min_count + 1):
                yield queue, resource, f"{queue.name}-st-{resource.name}-{n}", False
            for n in range(1, resource.max_count - resource.min_count + 1):
                yield queue, resource, f"{queue.name}-dy-{resource.name}-{n}", True


@dataclass(frozen=True)
class Faults:
    """Fault-injection knobs (docs/contracts.md); None/0 means off."""
    provisioning_delay: float = 3.0
    fail_create: str | None = None            # failureCode, e.g. OnNodeConfiguredExecutionFailure
    insufficient_capacity: tuple[str, ...] = ()  # compute resource names, or ("*",)
    # clustermgtd's insufficient_capacity_timeout: how long capacity-failed nodes stay down (0: no hold).
    insufficient_capacity_timeout: float = 600.0
    kill_node_after: float | None = None      # seconds after a job starts on a node
    ssh_outage: tuple[float, float] | None = None  # (after, duration) seconds after CREATE_COMPLETE
    boot_delay: float = 2.0
    # Targets NODE or NODE:always whose neuron-ls / fi_info report one device fewer (runtime/node_faults.py).
    neuron_unhealthy: tuple[str, ...] = ()
    efa_unhealthy: tuple[str, ...] = ()


ALWAYS = "always"


def parse_fault_target(text: str) -> tuple[str, bool]:
    """A node fault's target: `NODE` (that node's current or next instance) or `NODE:always` -> (node, always)."""
    node, sep, scope = text.strip().partition(":")
    if not node or any(c.isspace() for c in node) or (sep and scope != ALWAYS):
        raise ValueError(f"a node fault target is NODE or NODE:{ALWAYS}, got {text!r}")
    return node, bool(sep)


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
    image_os: str = "ubuntu2204"              # Image.Os: picks the SSH user (its default user)
    # DevSettings.Timeouts.ComputeNodeBootstrapTimeout; pcluster 3.16.1 NODE_BOOTSTRAP_TIMEOUT is 2100 s.
    compute_node_bootstrap_timeout: int = 2100
    alarms: bool = True                       # Monitoring.Alarms.Enabled
    log_group: bool = True                    # Monitoring.Logs.CloudWatch.Enabled
    log_retention_days: int = 180             # Monitoring.Logs.CloudWatch.RetentionInDays
    log_deletion_policy: str = "Retain"       # Monitoring.Logs.CloudWatch.DeletionPolicy

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
        for key in ("neuron_unhealthy", "efa_unhealthy"):
            if f.get(key) is not None:
                f[key] = tuple(f[key])
        return ClusterSpec(
            name=d["name"], region=d["region"], head_instance_type=d["head_instance_type"],
            key_name=d["key_name"], queues=queues, mount_dirs=tuple(d.get("mount_dirs", ("/fsx",))),
            accounting=d.get("accounting", False),
            scaledown_idletime_min=d.get("scaledown_idletime_min", 10.0),
            tags=tuple(tuple(t) for t in d.get("tags", ())), faults=Faults(**f),
            config_yaml=d.get("config_yaml", ""),
            **{k: d[k] for k in ("image_os", "compute_node_bootstrap_timeout", "alarms", "log_group",
                                 "log_retention_days", "log_deletion_policy") if k in d},
        )
