"""The trigger form's constants and the limits of the services they feed (ParallelCluster, AWS).

params.py builds the form from these; render_config and preflight check against the same values.
"""
from __future__ import annotations

TRAINING_QUEUE = "compute1"
MAX_QUEUES = 50  # ParallelCluster's limit on SlurmQueues
TRN1_INSTANCE_TYPES = ("trn1.32xlarge", "trn1n.32xlarge", "trn1.2xlarge")
# trn1.2xlarge has no EFA interface; the 32xlarge types have 8 (trn1) or 16 (trn1n).
EFA_INSTANCE_TYPES = frozenset({"trn1.32xlarge", "trn1n.32xlarge"})
# Image.Os: the Ubuntu releases ParallelCluster 3.16.1 accepts (its schema also takes alinux2023,
# rhel8/9 and rocky8/9, but on_node_configured.sh installs Neuron with apt). ubuntu2004, the blog's,
# is refused since 3.14. tests/unit/test_pcluster_real_schema.py compares this with the package.
IMAGE_OS = ("ubuntu2204", "ubuntu2404")
QUEUE_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,24}$"
# pcluster: starts with a letter, letters/digits/hyphens; 40 keeps room for Slurm accounting's limit.
CLUSTER_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9-]{0,39}$"
AMI_ID_PATTERN = r"^ami-[0-9a-f]{8,17}$"
ABSOLUTE_PATH_PATTERN = r"^/[A-Za-z0-9_./-]+$"
# Compute nodes' storage, as in the seed: a 1024 GiB root volume, the instance store (4 x 1.9 TB NVMe
# on trn1.32xlarge) mounted here for the jobs' scratch (the local_scratch_dir param points there).
COMPUTE_ROOT_VOLUME_GIB = 1024
LOCAL_STORAGE_MOUNT_DIR = "/local_storage"
# CloudWatch Logs retention ParallelCluster accepts (Monitoring.Logs.CloudWatch.RetentionInDays).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653)
# The resource_ttl_hours param's default: longer than any run, and than a sweep's network is held.
DEFAULT_RESOURCE_TTL_HOURS = 168
MAX_NODES = 256
# The training queue's capacity (Scheduling.SlurmQueues[].CapacityType, ParallelCluster 3.16) and the
# reservation its compute resource may target (CapacityReservationTarget); run/capacity.py has the rules.
CAPACITY_TYPES = ("ONDEMAND", "SPOT", "CAPACITY_BLOCK")
CAPACITY_RESERVATION_ID_PATTERN = r"^cr-[0-9a-f]{8,17}$"
CAPACITY_RESERVATION_GROUP_ARN_PATTERN = r"^arn:aws[a-z-]*:resource-groups:[a-z0-9-]+:[0-9]{12}:group/[A-Za-z0-9._-]{1,300}$"
# HeadNode.Ssh.AllowedIps: an IPv4 CIDR or a managed prefix list, what ParallelCluster takes (no IPv6);
# run/ssh_access.py judges the value.
SSH_ALLOWED_PATTERN = r"^([0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}|pl-[0-9a-z]+)$"

# The form's sections, in the order they appear (Airflow shows them as collapsible groups).
CLUSTER, TRAINING, DATA, NETWORK = "Cluster", "Training", "Data", "Network"
SWEEP, ADVANCED = "Sweep and cost", "Advanced"
SECTIONS = (CLUSTER, TRAINING, DATA, NETWORK, SWEEP, ADVANCED)
