"""libfabric's fi_info at the EFA installer's path, /opt/amazon/efa/bin/fi_info, as a stand-in.

Real nodes: the ParallelCluster AMI carries the EFA installer (libfabric and its tools under
/opt/amazon/efa) on every node; `fi_info -p efa -t FI_EP_RDM` lists one RDM endpoint per EFA device and
fabric. From libfabric 2.1 on each device's `rdmap<bus>s0-rdm` domain is listed twice, under the
`efa-direct` fabric first and then under `efa`, so a device count is the count of distinct domains.
An instance without EFA devices gets `fi_getinfo: -61 (No data available)` on stderr and exit code 61
(util/info.c: main returns -ret).

Here a node's EFA devices come from its instance type and its compute resource's `Efa.Enabled`
(instance_types.efa_devices); the head node has none. The `efa-unhealthy` fault (node_faults.py)
takes one device away. Only the efa provider is modelled; `-p` naming another answers -61.
"""
from __future__ import annotations

from pathlib import Path

from ..instance_types import efa_devices
from . import node_faults
from .paths import ClusterPaths

EFA_BIN = "/opt/amazon/efa/bin"
# fi_info's `version` is the efa provider's: 201.0 in libfabric 2.1 (an EFA installer's real output).
PROVIDER_VERSION = "201.0"


def _fi_info(paths: ClusterPaths, devices: dict[str, tuple[str, int]]) -> str:
    return f"""#!/bin/bash
# local UltraCluster stand-in for fi_info (libfabric, EFA installer): a real node's EFA devices from its
# instance type and Efa.Enabled; one fewer where the efa-unhealthy fault holds.
{node_faults.shell_devices(paths, "efa-unhealthy", devices)}
provider="" ep_type=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        -p|--provider) provider=${{2:-}}; shift ;;
        --provider=*) provider=${{1#*=}} ;;
        -t|--ep_type) ep_type=${{2:-}}; shift ;;
        --ep_type=*) ep_type=${{1#*=}} ;;
        -h|--help) echo "Usage: $0"; exit 1 ;;
        *) echo "fi_info (local UltraCluster stand-in): $1 is not modelled; use -p and -t" >&2; exit 1 ;;
    esac
    shift
done
case "$ep_type" in
    ""|FI_EP_UNSPEC) kinds="direct rdm dgram" ;;
    FI_EP_RDM) kinds="direct rdm" ;;
    FI_EP_DGRAM) kinds="dgram" ;;
    FI_EP_MSG) kinds="" ;;
    *) echo "error: Unrecognized endpoint type: $ep_type" >&2; exit 22 ;;
esac
if [ -n "$provider" ] && [ "$provider" != efa ]; then kinds=""; fi
if [ -z "$kinds" ] || [ "$devices" -eq 0 ]; then
    echo "fi_getinfo: -61 (No data available)" >&2
    exit 61
fi
for kind in $kinds; do
    case "$kind" in
        direct) fabric=efa-direct suffix=rdm type_name=FI_EP_RDM ;;
        rdm) fabric=efa suffix=rdm type_name=FI_EP_RDM ;;
        dgram) fabric=efa suffix=dgrm type_name=FI_EP_DGRAM ;;
    esac
    for ((i = 0; i < devices; i++)); do
        echo "provider: efa"
        echo "    fabric: $fabric"
        echo "    domain: rdmap$((16 + 8 * i))s0-$suffix"
        echo "    version: {PROVIDER_VERSION}"
        echo "    type: $type_name"
        echo "    protocol: FI_PROTO_EFA"
    done
done
"""


def install(layer_root: Path, paths: ClusterPaths, head: dict, nodes: list[dict]) -> None:
    """fi_info into a layer every node sees (the head node and the compute nodes)."""
    devices = {head["hostname"]: (head["instance_type"], 0)}   # HeadNode has no Efa setting
    devices |= {n["name"]: (n["instance_type"], efa_devices(n["instance_type"], n.get("efa", False)))
                for n in nodes}
    target = layer_root / EFA_BIN.lstrip("/") / "fi_info"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(_fi_info(paths, devices))
    target.chmod(0o755)
