"""The JSON shapes of pcluster's image commands, built from moto's AMI or the local build record.

Field names follow aws-parallelcluster 3.16.1's openapi.yaml (ImageInfoSummary,
DescribeImageResponseContent, Ec2AmiInfo); the status mapping is pcluster/api/converters.py's
cloud_formation_status_to_image_status, the not-found text image_operations_controller.py's, and the
AMI tags pcluster/templates/imagebuilder_stack.py's (``_get_image_tags``) plus its tag component's
build status. Null fields are left out, as pcluster's JSON encoder does.
"""
from __future__ import annotations

import re
from typing import Any

from .shapes import PCLUSTER_VERSION, iso_time

IMAGE_ID_TAG = "parallelcluster:image_id"
STATUS_TAG = "parallelcluster:build_status"
# pcluster/constants.py OS_TO_IMAGE_NAME_PART_MAP
OS_NAME_PARTS = {"alinux2023": "amzn2023-hvm", "ubuntu2204": "ubuntu-2204-lts-hvm", "ubuntu2404": "ubuntu-2404-lts-hvm",
                 "rhel8": "rhel8-hvm", "rocky8": "rocky8-hvm", "rhel9": "rhel9-hvm", "rocky9": "rocky9-hvm"}
_OFFICIAL = re.compile(r"aws-parallelcluster-[^-]+-(?P<part>.+-hvm)-.*")
# A fixed build date: every local home registers the same names.
_OFFICIAL_STAMP = "202601130000 2026-01-13T00-00-00.000Z"

_IMAGE_STATUS = {  # cloudformation status -> imageBuildStatus
    "CREATE_IN_PROGRESS": "BUILD_IN_PROGRESS", "CREATE_FAILED": "BUILD_FAILED", "CREATE_COMPLETE": "BUILD_COMPLETE",
    "ROLLBACK_IN_PROGRESS": "BUILD_FAILED", "ROLLBACK_FAILED": "BUILD_FAILED", "ROLLBACK_COMPLETE": "BUILD_FAILED",
    "DELETE_IN_PROGRESS": "DELETE_IN_PROGRESS", "DELETE_FAILED": "DELETE_FAILED", "DELETE_COMPLETE": "DELETE_COMPLETE",
}
# list-images --image-status -> the build stack statuses it lists (image_operations_controller.py)
_LISTED = {"PENDING": {"CREATE_IN_PROGRESS"},
           "FAILED": {"CREATE_FAILED", "DELETE_FAILED", "ROLLBACK_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_IN_PROGRESS"}}


def not_found_message(image_id: str) -> str:
    return f"No image or stack associated with ParallelCluster image id: {image_id}."


def official_name(os_name: str, architecture: str) -> str:
    return f"aws-parallelcluster-{PCLUSTER_VERSION}-{OS_NAME_PARTS[os_name]}-{architecture}-{_OFFICIAL_STAMP}"


def official_os(name: str) -> str:
    """pcluster's Ec2Client.extract_os_from_official_image_name."""
    match = _OFFICIAL.match(name or "")
    parts = {part: os_name for os_name, part in OS_NAME_PARTS.items()}
    return parts.get(match.group("part") if match else "", "linux")


def stack_statuses(image_status: str) -> set[str]:
    return _LISTED.get(image_status, set())


def image_status(stack_status: str) -> str:
    return _IMAGE_STATUS.get(stack_status, "BUILD_IN_PROGRESS")


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """ImageInfoSummary of a build record (build-image, list-images PENDING/FAILED)."""
    out = {"imageId": record["imageId"], "imageBuildStatus": image_status(record["cloudformationStackStatus"]),
           "cloudformationStackStatus": record["cloudformationStackStatus"],
           "cloudformationStackArn": record["cloudformationStackArn"], "region": record["region"],
           "version": record["version"]}
    return {k: v for k, v in out.items() if v is not None}


def describe_building(record: dict[str, Any], config_url: str) -> dict[str, Any]:
    """describe-image while the build stack exists (_stack_to_describe_image_response)."""
    out = {
        "imageConfiguration": {"url": config_url},
        "imageId": record["imageId"],
        "imageBuildStatus": image_status(record["cloudformationStackStatus"]),
        "imageBuildLogsArn": record.get("imageBuildLogsArn"),
        "imagebuilderImageStatus": record.get("imagebuilderImageStatus"),
        "imagebuilderImageStatusReason": record.get("imagebuilderImageStatusReason"),
        "cloudformationStackStatus": record["cloudformationStackStatus"],
        "cloudformationStackStatusReason": record.get("cloudformationStackStatusReason"),
        "cloudformationStackArn": record["cloudformationStackArn"],
        "cloudformationStackCreationTime": record["creationTime"],
        "cloudformationStackTags": [{"key": k, "value": v} for k, v in record.get("stackTags") or []],
        "region": record["region"],
        "version": record["version"],
    }
    return {k: v for k, v in out.items() if v is not None}


def describe_built(ami: dict[str, Any], image_id: str, config_url: str, region: str) -> dict[str, Any]:
    """describe-image of a built image, from its AMI (_image_to_describe_image_response)."""
    tags = [{"key": t["Key"], "value": t["Value"]} for t in ami.get("Tags") or []]
    version = next((t["value"] for t in tags if t["key"] == "parallelcluster:version"), PCLUSTER_VERSION)
    info = {"amiName": ami.get("Name"), "amiId": ami["ImageId"], "state": str(ami.get("State", "")).upper(),
            "tags": tags, "architecture": ami.get("Architecture"), "description": ami.get("Description")}
    created = ami.get("CreationDate")
    return {
        **({"creationTime": iso_time(_parse(created))} if created else {}),
        "imageConfiguration": {"url": config_url},
        "imageId": image_id,
        "imageBuildStatus": "BUILD_COMPLETE",
        "ec2AmiInfo": {k: v for k, v in info.items() if v is not None},
        "region": region,
        "version": version,
    }


def _parse(moment: str):
    from datetime import datetime

    return datetime.fromisoformat(moment.replace("Z", "+00:00"))
