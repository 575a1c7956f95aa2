"""JSON Schema of the ParallelCluster v3 config, the structural part of validation.

Required keys, enums and bounds follow pcluster 3.16.1's marshmallow ClusterSchema. Sections whose
full key set is listed here reject unknown keys as pcluster does; deeper sections we do not model
(Iam, CustomActions, LocalStorage, ...) accept any object.
"""
from __future__ import annotations

from typing import Any

# Image.Os values pcluster 3.16.1 accepts, plus the blog-era ones the Trn1 samples use
# (ubuntu2004, alinux2): 3.16.1 rejects those, so they only raise a WARNING here (validate.py).
SUPPORTED_OS = ("alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rocky8", "rhel9", "rocky9")
RETIRED_OS = ("alinux2", "ubuntu2004", "centos7")

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_STRING: dict[str, Any] = {"type": "string"}
_BOOL: dict[str, Any] = {"type": "boolean"}
_ENABLED: dict[str, Any] = {"type": "object", "properties": {"Enabled": _BOOL}}


def _strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


# Monitoring.Logs.CloudWatch.RetentionInDays: pcluster 3.16.1's OneOf; Alarms and the log group's
# DeletionPolicy shape the cluster stack (the rest of Monitoring is not modelled).
RETENTION_IN_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653)
_MONITORING = {"type": "object", "properties": {"Logs": {"type": "object", "properties": {
    "CloudWatch": {"type": "object", "properties": {
        "Enabled": _BOOL, "RetentionInDays": {"enum": list(RETENTION_IN_DAYS)},
        "DeletionPolicy": {"enum": ["Retain", "Delete"]}}},
}}, "Alarms": _ENABLED}}
_POSITIVE = {"type": "integer", "minimum": 1}
# DevSettings.Timeouts (pcluster 3.16.1 TimeoutsSchema, Range(min=1)); the rest of DevSettings is open.
_DEV_SETTINGS = {"type": "object", "properties": {"Timeouts": _strict({
    "HeadNodeBootstrapTimeout": _POSITIVE, "ComputeNodeBootstrapTimeout": _POSITIVE,
    "ComputeInstanceInfoTimeout": _POSITIVE})}}

_TAGS = {"type": "array", "items": _strict({"Key": _STRING, "Value": _STRING}, ("Key", "Value"))}

_COMPUTE_RESOURCE = _strict({
    "Name": _STRING, "InstanceType": _STRING, "Instances": {"type": "array"},
    "MinCount": {"type": "integer", "minimum": 0}, "MaxCount": {"type": "integer", "minimum": 1},
    "Efa": {"type": "object", "properties": {"Enabled": _BOOL, "GdrSupport": _BOOL}},
    "DisableSimultaneousMultithreading": _BOOL, "SpotPrice": {"type": "number"},
    "SchedulableMemory": {"type": "integer"}, "CapacityReservationTarget": _ANY_OBJECT,
    "Networking": _ANY_OBJECT, "HealthChecks": _ANY_OBJECT, "CustomSlurmSettings": _ANY_OBJECT,
    "Tags": _TAGS, "StaticNodePriority": {"type": "integer"}, "DynamicNodePriority": {"type": "integer"},
    "LaunchTemplateOverrides": _ANY_OBJECT,
}, ("Name",))

_QUEUE = _strict({
    "Name": _STRING,
    "CapacityType": {"enum": ["ONDEMAND", "SPOT", "CAPACITY_BLOCK"]},
    "AllocationStrategy": _STRING,
    "Networking": _strict({
        "SubnetIds": {"type": "array", "items": _STRING, "minItems": 1, "maxItems": 1},
        "AssignPublicIp": _BOOL, "SecurityGroups": {"type": "array"}, "AdditionalSecurityGroups": {"type": "array"},
        "PlacementGroup": {"type": "object", "properties": {"Enabled": _BOOL, "Id": _STRING, "Name": _STRING},
                           "additionalProperties": False},
        "Proxy": _ANY_OBJECT,
    }, ("SubnetIds",)),
    "ComputeResources": {"type": "array", "items": _COMPUTE_RESOURCE, "minItems": 1},
    "ComputeSettings": _ANY_OBJECT, "CustomActions": _ANY_OBJECT, "Iam": _ANY_OBJECT, "Image": _ANY_OBJECT,
    "CapacityReservationTarget": _ANY_OBJECT, "HealthChecks": _ANY_OBJECT, "CustomSlurmSettings": _ANY_OBJECT,
    "JobExclusiveAllocation": _BOOL, "Tags": _TAGS,
}, ("Name", "Networking"))

CLUSTER_SCHEMA: dict[str, Any] = _strict({
    "Region": _STRING,
    "Image": _strict({"Os": {"enum": list(SUPPORTED_OS + RETIRED_OS)}, "CustomAmi": _STRING}, ("Os",)),
    "HeadNode": _strict({
        "InstanceType": _STRING,
        "Networking": _strict({
            "SubnetId": _STRING, "ElasticIp": {"type": ["string", "boolean"]},
            "SecurityGroups": {"type": "array"}, "AdditionalSecurityGroups": {"type": "array"}, "Proxy": _ANY_OBJECT,
        }, ("SubnetId",)),
        "Ssh": _strict({"KeyName": _STRING, "AllowedIps": _STRING}),
        "DisableSimultaneousMultithreading": _BOOL, "LocalStorage": _ANY_OBJECT, "Dcv": _ANY_OBJECT,
        "CustomActions": _ANY_OBJECT, "Iam": _ANY_OBJECT, "Imds": _ANY_OBJECT, "Image": _ANY_OBJECT,
        "SharedStorageType": _STRING, "SharedStorageEfsSettings": _ANY_OBJECT,
    }, ("InstanceType", "Networking")),
    "Scheduling": _strict({
        "Scheduler": {"enum": ["slurm"]},
        "SlurmSettings": _strict({
            "ScaledownIdletime": {"type": "integer", "minimum": -1},
            "Database": _ANY_OBJECT, "ExternalSlurmdbd": _ANY_OBJECT, "Dns": _ANY_OBJECT,
            "QueueUpdateStrategy": _STRING, "EnableMemoryBasedScheduling": _BOOL, "CustomSlurmSettings": {},
            "CustomSlurmSettingsIncludeFile": _STRING, "MungeKeySecretArn": _STRING,
        }),
        "SlurmQueues": {"type": "array", "items": _QUEUE, "minItems": 1},
        "ScalingStrategy": _STRING,
    }, ("Scheduler", "SlurmQueues")),
    "SharedStorage": {"type": "array", "items": _strict({
        "MountDir": _STRING, "Name": _STRING,
        "StorageType": {"enum": ["Ebs", "Efs", "FsxLustre", "FsxOpenZfs", "FsxOntap", "FileCache"]},
        "EbsSettings": _ANY_OBJECT, "EfsSettings": _ANY_OBJECT, "FsxLustreSettings": _ANY_OBJECT,
        "FsxOntapSettings": _ANY_OBJECT, "FsxOpenZfsSettings": _ANY_OBJECT, "FileCacheSettings": _ANY_OBJECT,
    }, ("MountDir", "Name", "StorageType"))},
    "Iam": _ANY_OBJECT, "Monitoring": _MONITORING, "AdditionalPackages": _ANY_OBJECT, "Tags": _TAGS,
    "CustomS3Bucket": _STRING, "AdditionalResources": _STRING, "DevSettings": _DEV_SETTINGS, "Imds": _ANY_OBJECT,
    "DeploymentSettings": _ANY_OBJECT, "LoginNodes": _ANY_OBJECT, "DirectoryService": _ANY_OBJECT,
}, ("HeadNode", "Image", "Scheduling"))
