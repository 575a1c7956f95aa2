"""Runtime of the local UltraCluster: ClusterSpec -> running Slurm/munge/sshd daemons, and back.

Public API (the CLI codes against it):
    provision(spec, cluster_dir) -> dict, teardown(cluster_dir), describe_runtime(cluster_dir) -> dict,
    set_compute_fleet(cluster_dir, status) -> str, stop_everything(home) -> list[str]
"""
from .describe import describe_runtime
from .errors import RuntimeProvisionError
from .fleet import set_compute_fleet
from .provision import provision
from .teardown import stop_everything, teardown

__all__ = ["provision", "teardown", "describe_runtime", "set_compute_fleet", "stop_everything",
           "RuntimeProvisionError"]
