"""Who may reach the head node's SSH: ``HeadNode.Ssh.AllowedIps`` from ``ssh_allowed_cidr``, else the
deployment's ``head_node_ssh_cidr`` (docs/operations.md, "Reaching the head node").

ParallelCluster opens port 22 to 0.0.0.0/0 when AllowedIps is not set, so the pipeline always renders
it, and a world-open value (any /0, or no value) needs the explicit ``allow_world_ssh``. The pipeline's
own SSH comes from the Airflow workers: their egress CIDR (or a prefix list) is what production needs.
People reach the head node through SSM Session Manager, which needs no inbound rule.
"""
from __future__ import annotations

import ipaddress

WORLD = "0.0.0.0/0"
SSM_HINT = "people reach the head node through SSM Session Manager (docs/operations.md, \"Reaching the head node\")"


def effective_cidr(param: str | None, deployment: str | None) -> str | None:
    """The run's ``ssh_allowed_cidr``, else the deployment's (the profile's ``head_node_ssh_cidr``: where
    its Airflow workers connect from); None when neither is set."""
    return (param or "").strip() or (deployment or "").strip() or None


def allowed_ips(cidr: str | None, allow_world: bool) -> str:
    """The value to render as AllowedIps; raises ValueError (naming the params) for one to refuse."""
    cidr = (cidr or "").strip()
    if not cidr:
        if allow_world:
            return WORLD   # written out: never left to ParallelCluster's default
        raise ValueError(
            "ssh_allowed_cidr: not set, and ParallelCluster then opens the head node's SSH (port 22) to the "
            f"whole internet ({WORLD}). Set it, or the deployment's head_node_ssh_cidr (the production profile "
            "reads ULTRACLUSTER_SSH_ALLOWED_CIDR), to the CIDR the Airflow workers connect from or a prefix list "
            f"(pl-...); {SSM_HINT}. To open SSH to the world anyway, set allow_world_ssh")
    if cidr.startswith("pl-"):
        return cidr
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ValueError(f"ssh_allowed_cidr: {cidr!r} is neither a CIDR nor a prefix list (pl-...)") from None
    if network.prefixlen == 0 and not allow_world:
        raise ValueError(
            f"ssh_allowed_cidr: {cidr} opens the head node's SSH (port 22) to the whole internet, where it is "
            "scanned and brute-forced within minutes of boot. Name the CIDR the Airflow workers connect from, "
            f"or a prefix list; {SSM_HINT}. To open SSH to the world anyway, set allow_world_ssh")
    if network.version != 4:
        raise ValueError(f"ssh_allowed_cidr: {cidr!r} is IPv6; ParallelCluster's AllowedIps takes an IPv4 CIDR or "
                         "a prefix list")
    return cidr


def ssh_problems(cidr: str | None, allow_world: bool) -> list[str]:
    """``allowed_ips``' refusal as a preflight problem line (none when the value renders)."""
    try:
        allowed_ips(cidr, allow_world)
    except ValueError as err:
        return [str(err)]
    return []


def ssh_warnings(cidr: str | None, allow_world: bool) -> list[str]:
    """A world-open SSH that ``allow_world_ssh`` let through: worth a line in the task log."""
    try:
        value = allowed_ips(cidr, allow_world)
    except ValueError:
        return []
    if value.startswith("pl-") or ipaddress.ip_network(value, strict=False).prefixlen:
        return []
    return [f"ssh_allowed_cidr: the head node's SSH (port 22) is open to the whole internet ({value}), as "
            f"allow_world_ssh allows; {SSM_HINT}"]


def flag(value: object) -> bool:
    """A boolean param as rendered templates may pass it (True, "True", "true")."""
    return value is True or str(value).strip().lower() == "true"
