"""EC2 instance types the local UltraCluster knows (stands in for ec2:DescribeInstanceTypes)."""
from __future__ import annotations

# Accelerated and HPC types are listed exactly; common families take the usual size ladder.
_EXACT = {
    "trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge",
    "inf2.xlarge", "inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge",
    "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "hpc6a.48xlarge", "hpc6id.32xlarge",
    "hpc7a.12xlarge", "hpc7a.24xlarge", "hpc7a.48xlarge", "hpc7a.96xlarge", "hpc7g.4xlarge",
    "hpc7g.8xlarge", "hpc7g.16xlarge", "c5n.18xlarge", "c5n.metal",
}
_FAMILIES = {
    "t2", "t3", "t3a", "m5", "m5a", "m5n", "m6i", "m6a", "m7i", "c5", "c5a", "c5n", "c6i", "c6a", "c6g",
    "c6gn", "c7i", "c7g", "r5", "r5a", "r6i", "r7i", "g4dn", "g5", "g6", "x2idn",
}
_SIZES = {
    "nano", "micro", "small", "medium", "large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "9xlarge",
    "12xlarge", "16xlarge", "18xlarge", "24xlarge", "32xlarge", "48xlarge", "metal",
}


def is_known_instance_type(name: str) -> bool:
    if name in _EXACT:
        return True
    family, _, size = name.partition(".")
    return family in _FAMILIES and size in _SIZES


# What ec2:DescribeInstanceTypes reports of the accelerator instances' devices (NeuronInfo, EfaInfo).
# Neuron devices (2 NeuronCores, 32 GiB each): Neuron docs, "Amazon EC2 Trn1/Trn1n Architecture".
NEURON_DEVICES = {"trn1.2xlarge": 1, "trn1.32xlarge": 16, "trn1n.32xlarge": 16}
# EFA devices: Neuron docs, "How to prepare trn1.32xlarge for multi-node execution" ("trn1.32xlarge has
# 8 EFA devices, trn1n.32xlarge has 16"; the smaller sizes have none).
EFA_DEVICES = {"trn1.32xlarge": 8, "trn1n.32xlarge": 16}


def neuron_devices(instance_type: str) -> int:
    return NEURON_DEVICES.get(instance_type, 0)


def efa_devices(instance_type: str, efa_enabled: bool) -> int:
    """EFA devices of an instance: only when its compute resource enables EFA (pcluster then launches it
    with EFA network interfaces) and its type has them."""
    return EFA_DEVICES.get(instance_type, 0) if efa_enabled else 0
