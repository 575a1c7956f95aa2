"""Validated ParallelCluster config -> ClusterSpec, with the fault knobs of docs/contracts.md."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .shapes import FAILURE_REASONS, validation_error
from .spec import ClusterSpec, ComputeResource, Faults, Queue, node_plan, parse_fault_target

TAG_PREFIX = "local-ultracluster:"
# knob -> environment variable; a config tag `local-ultracluster:<knob>` wins over the variable.
FAULT_ENV = {
    "provisioning-delay": "LOCAL_UC_PROVISIONING_DELAY",
    "fail-create": "LOCAL_UC_FAIL_CREATE",
    "insufficient-capacity": "LOCAL_UC_INSUFFICIENT_CAPACITY",
    "insufficient-capacity-timeout": "LOCAL_UC_INSUFFICIENT_CAPACITY_TIMEOUT",
    "kill-node-after": "LOCAL_UC_KILL_NODE_AFTER",
    "ssh-outage": "LOCAL_UC_SSH_OUTAGE",
    "boot-delay": "LOCAL_UC_BOOT_DELAY",
    "neuron-unhealthy": "LOCAL_UC_NEURON_UNHEALTHY",
    "efa-unhealthy": "LOCAL_UC_EFA_UNHEALTHY",
}
FAULT_VALIDATOR = "LocalUltraClusterFaultValidator"


class FaultError(ValueError):
    pass


def config_tags(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(str(t["Key"]), str(t["Value"])) for t in config.get("Tags") or []]


def _knob_values(config: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    values = {knob: env[var] for knob, var in FAULT_ENV.items() if env.get(var, "") != ""}
    for key, value in config_tags(config):
        if key.startswith(TAG_PREFIX):
            knob = key[len(TAG_PREFIX):]
            if knob not in FAULT_ENV:
                raise FaultError(f"Unknown tag {key}; known: {', '.join(TAG_PREFIX + k for k in FAULT_ENV)}")
            values[knob] = value
    return values


def _seconds(knob: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FaultError(f"{knob} must be a number of seconds, got {text!r}") from None
    if value < 0:
        raise FaultError(f"{knob} must not be negative, got {text!r}")
    return value


def _node_targets(knob: str, text: str, nodes: list[str] | None) -> tuple[str, ...]:
    """NODE[:always],... naming compute nodes of the config (when ``nodes`` is known)."""
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    for target in targets:
        try:
            node, _ = parse_fault_target(target)
        except ValueError as error:
            raise FaultError(f"{knob}: {error}") from None
        if nodes is not None and node not in nodes:
            raise FaultError(f"{knob}: {node!r} is not a compute node of this cluster; its nodes: {', '.join(nodes)}")
    return targets


def _config_node_names(config: Mapping[str, Any]) -> list[str] | None:
    try:
        return [name for _, _, name, _ in node_plan([_queue(q) for q in config["Scheduling"]["SlurmQueues"]])]
    except (KeyError, TypeError, IndexError, ValueError):
        return None   # the schema validator reports a malformed config


def build_faults(config: Mapping[str, Any], env: Mapping[str, str]) -> Faults:
    values = _knob_values(config, env)
    fail_create = values.get("fail-create") or None
    if fail_create and fail_create not in FAILURE_REASONS:
        raise FaultError(f"fail-create must be a pcluster failure code ({', '.join(FAILURE_REASONS)}), "
                         f"got {fail_create!r}")
    capacity = tuple(n.strip() for n in values.get("insufficient-capacity", "").split(",") if n.strip())
    outage = None
    if values.get("ssh-outage"):
        after, sep, duration = values["ssh-outage"].partition(":")
        if not sep:
            raise FaultError(f"ssh-outage must be AFTER:DURATION seconds, got {values['ssh-outage']!r}")
        outage = (_seconds("ssh-outage", after), _seconds("ssh-outage", duration))
    kill_after = values.get("kill-node-after")
    nodes = _config_node_names(config)
    return Faults(
        provisioning_delay=_seconds("provisioning-delay", values.get("provisioning-delay", "3")),
        fail_create=fail_create,
        insufficient_capacity=capacity,
        insufficient_capacity_timeout=_seconds("insufficient-capacity-timeout",
                                               values.get("insufficient-capacity-timeout", "600")),
        kill_node_after=_seconds("kill-node-after", kill_after) if kill_after else None,
        ssh_outage=outage,
        boot_delay=_seconds("boot-delay", values.get("boot-delay", "2")),
        neuron_unhealthy=_node_targets("neuron-unhealthy", values.get("neuron-unhealthy", ""), nodes),
        efa_unhealthy=_node_targets("efa-unhealthy", values.get("efa-unhealthy", ""), nodes),
    )


def fault_findings(config: Mapping[str, Any], env: Mapping[str, str]) -> list[dict[str, str]]:
    try:
        build_faults(config, env)
    except FaultError as error:
        return [validation_error("ERROR", FAULT_VALIDATOR, str(error))]
    return []


def _compute_resource(resource: Mapping[str, Any]) -> ComputeResource:
    instance_type = resource.get("InstanceType") or resource["Instances"][0]["InstanceType"]
    return ComputeResource(
        name=resource["Name"], instance_type=instance_type,
        min_count=int(resource.get("MinCount", 0)), max_count=int(resource.get("MaxCount", 10)),
        efa=bool((resource.get("Efa") or {}).get("Enabled", False)),
    )


def _queue(queue: Mapping[str, Any]) -> Queue:
    placement = (queue.get("Networking") or {}).get("PlacementGroup") or {}
    return Queue(
        name=queue["Name"], capacity_type=queue.get("CapacityType", "ONDEMAND"),
        placement_group=bool(placement.get("Enabled", False)),
        compute_resources=tuple(_compute_resource(r) for r in queue["ComputeResources"]),
    )


def _monitoring(config: Mapping[str, Any]) -> dict[str, Any]:
    """The head node's alarms and the cluster's log group, with pcluster 3.16.1's defaults."""
    monitoring = config.get("Monitoring") or {}
    cloud_watch = (monitoring.get("Logs") or {}).get("CloudWatch") or {}
    return {"alarms": bool((monitoring.get("Alarms") or {}).get("Enabled", True)),
            "log_group": bool(cloud_watch.get("Enabled", True)),
            "log_retention_days": int(cloud_watch.get("RetentionInDays", 180)),
            "log_deletion_policy": str(cloud_watch.get("DeletionPolicy", "Retain"))}


def build_spec(cluster_name: str, region: str, config: Mapping[str, Any], config_text: str,
               env: Mapping[str, str]) -> ClusterSpec:
    settings = config["Scheduling"].get("SlurmSettings") or {}
    timeouts = (config.get("DevSettings") or {}).get("Timeouts") or {}
    return ClusterSpec(
        name=cluster_name, region=region,
        head_instance_type=config["HeadNode"]["InstanceType"],
        key_name=config["HeadNode"]["Ssh"]["KeyName"],
        queues=tuple(_queue(q) for q in config["Scheduling"]["SlurmQueues"]),
        mount_dirs=tuple(s["MountDir"] for s in config.get("SharedStorage") or []),
        accounting="Database" in settings,
        scaledown_idletime_min=float(settings.get("ScaledownIdletime", 10)),
        tags=tuple(config_tags(config)),
        faults=build_faults(config, env),
        config_yaml=config_text,
        image_os=config["Image"]["Os"],
        compute_node_bootstrap_timeout=int(timeouts.get("ComputeNodeBootstrapTimeout", 2100)),
        **_monitoring(config),
    )
