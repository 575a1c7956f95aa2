"""The JSON shapes pcluster v3 prints, built from local state.

Field names and message texts follow aws-parallelcluster 3.16.1 (pcluster/api/models, controllers);
null fields are left out as its JSON encoder does.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

PCLUSTER_VERSION = "3.16.1"

CLUSTER_STATUSES = (
    "CREATE_IN_PROGRESS", "CREATE_FAILED", "CREATE_COMPLETE", "DELETE_IN_PROGRESS", "DELETE_FAILED",
    "UPDATE_IN_PROGRESS", "UPDATE_COMPLETE", "UPDATE_FAILED",
)

# CloudFormation stack status -> clusterStatus (pcluster/api/converters.py); others map to themselves.
_CFN_TO_CLUSTER_STATUS = {
    "ROLLBACK_IN_PROGRESS": "CREATE_FAILED",
    "ROLLBACK_FAILED": "CREATE_FAILED",
    "ROLLBACK_COMPLETE": "CREATE_FAILED",
    "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS": "UPDATE_IN_PROGRESS",
    "UPDATE_ROLLBACK_IN_PROGRESS": "UPDATE_IN_PROGRESS",
    "UPDATE_ROLLBACK_FAILED": "UPDATE_FAILED",
    "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS": "UPDATE_IN_PROGRESS",
    "UPDATE_ROLLBACK_COMPLETE": "UPDATE_FAILED",
}

# failureCode -> failureReason as pcluster reports them (pcluster/models/cluster_resources.py).
FAILURE_REASONS = {
    "AmiVersionMismatch": "ParallelCluster version of the custom AMI is different than the cookbook. "
                          "Please make them consistent.",
    "InvalidAmi": "The custom AMI is invalid. It needs to be created using build-image command by providing "
                  "your AMI as parent image.",
    "OnNodeConfiguredExecutionFailure": "Failed to execute OnNodeConfigured script.",
    "OnNodeConfiguredDownloadFailure": "Failed to download OnNodeConfigured script.",
    "OnNodeConfiguredFailure": "Failed to run OnNodeConfigured script.",
    "OnNodeStartExecutionFailure": "Failed to execute OnNodeStart script.",
    "OnNodeStartDownloadFailure": "Failed to download OnNodeStart script.",
    "OnNodeStartFailure": "Failed to run OnNodeStart script.",
    "EbsMountFailure": "Failed to mount EBS volume.",
    "EfsMountFailure": "Failed to mount EFS.",
    "FsxMountFailure": "Failed to mount FSX.",
    "RaidMountFailure": "Failed to mount RAID array.",
    "HeadNodeBootstrapFailure": "Failed to bootstrap the head node.",
    "ResourceCreationFailure": "Failed to create resources for head node bootstrap.",
    "StaticNodeBootstrapFailure": "Cluster has been set to PROTECTED mode due to failures detected in static "
                                  "node provisioning.",
    "ClusterCreationFailure": "Failed to create the cluster.",
}

INSTANCE_KEYS = ("instanceId", "instanceType", "launchTime", "privateIpAddress", "publicIpAddress", "state",
                 "nodeType", "queueName", "poolName")
HEAD_NODE_KEYS = ("instanceId", "instanceType", "launchTime", "privateIpAddress", "publicIpAddress", "state")


def iso_now() -> str:
    return iso_time(dt.datetime.now(dt.UTC))


def iso_time(moment: dt.datetime) -> str:
    """ISO 8601 UTC with milliseconds and a Z, like pcluster's to_iso_timestr."""
    utc = moment.astimezone(dt.UTC) if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    return utc.isoformat(timespec="milliseconds")[:-6] + "Z"


def cluster_status_of(stack_status: str) -> str:
    return _CFN_TO_CLUSTER_STATUS.get(stack_status, stack_status)


def failure_for(code: str) -> dict[str, str]:
    return {"failureCode": code, "failureReason": FAILURE_REASONS.get(code, FAILURE_REASONS["ClusterCreationFailure"])}


def not_found_message(name: str, suffix: str = "") -> str:
    message = f"Cluster '{name}' does not exist or belongs to an incompatible ParallelCluster major version."
    return f"{message} {suffix}" if suffix else message


DELETE_NOT_FOUND_SUFFIX = ("In case you have running instances belonging to a deleted cluster please use the "
                           "DeleteClusterInstances API.")


def cluster_summary(state: dict[str, Any]) -> dict[str, Any]:
    """ClusterInfoSummary: create, delete and list print this (lower-case 'cloudformationStackStatus')."""
    return {
        "clusterName": state["clusterName"],
        "cloudformationStackStatus": state["cloudFormationStackStatus"],
        "cloudformationStackArn": state["cloudformationStackArn"],
        "region": state["region"],
        "version": state["version"],
        "clusterStatus": cluster_status_of(state["cloudFormationStackStatus"]),
        "scheduler": {"type": "slurm"},
    }


def describe_cluster(state: dict[str, Any], config_url: str, head_node: dict[str, Any] | None) -> dict[str, Any]:
    status = cluster_status_of(state["cloudFormationStackStatus"])
    out: dict[str, Any] = {
        "creationTime": state["creationTime"],
        "version": state["version"],
        "clusterConfiguration": {"url": config_url},
        "tags": [{"key": k, "value": v} for k, v in state["stackTags"]],
        "cloudFormationStackStatus": state["cloudFormationStackStatus"],
        "clusterName": state["clusterName"],
        "computeFleetStatus": state["computeFleetStatus"],
        "cloudformationStackArn": state["cloudformationStackArn"],
        "lastUpdatedTime": state["lastUpdatedTime"],
        "region": state["region"],
        "clusterStatus": status,
        "scheduler": {"type": "slurm"},
    }
    if status == "CREATE_FAILED":
        failure = failure_for(state.get("failureCode") or "ClusterCreationFailure")
        if state.get("failureReason"):
            failure["failureReason"] = state["failureReason"]
        out["failures"] = [failure]
    if head_node:
        out["headNode"] = {k: head_node[k] for k in HEAD_NODE_KEYS if head_node.get(k) is not None}
    return out


def instance_entry(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep only the keys of pcluster's ClusterInstance, dropping nulls."""
    return {k: raw[k] for k in INSTANCE_KEYS if raw.get(k) is not None}


def validation_error(level: str, type_: str, message: str) -> dict[str, str]:
    return {"level": level, "type": type_, "message": message}


def invalid_configuration(errors: list[dict[str, str]]) -> dict[str, Any]:
    return {"configurationValidationErrors": errors, "message": "Invalid cluster configuration."}
