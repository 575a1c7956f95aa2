"""`pcluster build-image`, `describe-image`, `list-images`, `delete-image` and `list-official-images`,
backed by the local UltraCluster: the image's AMI and build stack live in moto, its build in a local
worker (image_build.py: the components run in a scratch root with recording shims).

JSON shapes and messages follow aws-parallelcluster 3.16.1 (pcluster/api/openapi/openapi.yaml:
BuildImageResponseContent, DescribeImageResponseContent, ListImagesResponseContent,
DeleteImageResponseContent, ListOfficialImagesResponseContent; image_operations_controller.py, and
ImageBuilder's errors in pcluster/models/imagebuilder.py). As there, a built image is found by its
AMI's tags (``parallelcluster:image_id``, ``parallelcluster:build_status`` = available) and an
image still building, or failed, by its build stack; the local state file adds what moto cannot
hold (the build's status while it runs, Image Builder's reason).

<home>/images/<image id>/image.json   the build: status, stack, reason, AMI
<home>/images/<image id>/root/        the scratch root: what the build changed under /etc, /opt, /usr
<home>/images/<image id>/calls.jsonl  every apt-get, apt-cache, apt-mark, dkms, pip, wget, gpg, curl call
<home>/images/<image id>/build.log    the components' output
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from . import state, validate
from .aws import Aws, region_from_env
from .cli_args import Failure, resolve_region
from .config_schema import SUPPORTED_OS
from .image_shapes import (
    IMAGE_ID_TAG,
    STATUS_TAG,
    describe_built,
    describe_building,
    not_found_message,
    official_name,
    official_os,
    stack_statuses,
    summary,
)
from .instance_types import is_known_instance_type
from .shapes import PCLUSTER_VERSION
from .worker import worker_alive

IMAGE_ID_PATTERN = "^[a-zA-Z][a-zA-Z0-9-]+$"
ARCHITECTURES = ("x86_64", "arm64")
_TOP_KEYS = {"Region", "Image", "Build", "DevSettings", "CustomS3Bucket", "DeploymentSettings"}


def images_root() -> Path:
    return state.uc_home() / "images"


def image_dir(image_id: str) -> Path:
    return images_root() / image_id


def _lock(image_id: str):
    return state.cluster_lock(f"image-{image_id}")


def read_image(image_id: str) -> dict[str, Any] | None:
    try:
        return json.loads((image_dir(image_id) / "image.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_image(record: dict[str, Any]) -> None:
    state.write_json_atomic(image_dir(record["imageId"]) / "image.json", record)


# --- the AMI in moto ---------------------------------------------------------------------------

def built_amis(aws: Aws, image_id: str | None = None) -> list[dict[str, Any]]:
    """The account's available ParallelCluster images (pcluster's Ec2Client.get_images / image_exists)."""
    filters = [{"Name": "tag-key", "Values": [IMAGE_ID_TAG]}, {"Name": f"tag:{STATUS_TAG}", "Values": ["available"]}]
    if image_id:
        filters.append({"Name": f"tag:{IMAGE_ID_TAG}", "Values": [image_id]})
    return aws.client("ec2").describe_images(Owners=["self"], Filters=filters)["Images"]


def _ami_tags(ami: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in ami.get("Tags") or []}


def _config_url(aws: Aws, record: dict[str, Any] | None) -> str:
    try:
        return aws.presigned_config_url(record["configBucket"], record["configKey"]) if record else "NOT_AVAILABLE"
    except Exception:
        return "NOT_AVAILABLE"


# --- commands ----------------------------------------------------------------------------------

def build_image(args: argparse.Namespace) -> dict[str, Any]:
    config = validate.load_yaml(args.image_configuration)
    region = resolve_region(args.region, config.get("Region") if isinstance(config.get("Region"), str) else None)
    image_id: str = args.image_id
    if len(image_id) > 128:
        raise Failure(f"Bad Request: Image id '{image_id}' failed to satisfy constraint: The process id can contain "
                      "only alphanumeric characters (case-sensitive) and hyphens. It must start with an alphabetic "
                      "character and can't be longer than 128 characters.")
    aws = Aws(region)
    errors = _schema_errors(config)
    if errors:
        raise Failure({"configurationValidationErrors": errors, "message": "Invalid image configuration."})
    if built_amis(aws, image_id):
        raise Failure(f"ParallelCluster image {image_id} already exists.")
    if read_image(image_id) is not None or aws.stack_exists(image_id):
        raise Failure(f"ParallelCluster build infrastructure for image {image_id} or a CloudFormation Stack with "
                      "the same name already exists.")
    findings = _validator_findings(config, aws)
    kept = [f for f in findings if not validate.suppressed(f, args.suppress_validators or [])]
    threshold = validate.LEVELS.index(args.validation_failure_level or "ERROR")
    if any(validate.LEVELS.index(f["level"]) >= threshold for f in kept):
        # ImageBuilder's BadRequestImageBuilderActionError, as BuildImageBadRequestException.
        raise Failure({"configurationValidationErrors": kept, "message": "Configuration is invalid"})
    if args.dryrun:
        raise Failure({**({"validationMessages": kept} if kept else {}),
                       "message": "Request would have succeeded, but DryRun flag is set."})
    from .image_build import start_build
    record = start_build(image_id, region, args.image_configuration, config, aws,
                         rollback=args.rollback_on_failure is True)
    return {"image": summary(record), **({"validationMessages": kept} if kept else {})}


def _schema_errors(config: dict[str, Any]) -> list[dict[str, str]]:
    """What pcluster's ImageBuilderSchema refuses, in its ImageSchemaValidator finding."""
    problems = [f"'{k}': ['Unknown field.']" for k in sorted(set(config) - _TOP_KEYS)]
    build = config.get("Build")
    if not isinstance(build, dict):
        problems.append("'Build': ['Missing data for required field.']")
        build = {}
    for key in ("InstanceType", "ParentImage"):
        if key in config.get("Build", {}) and not isinstance(build[key], str):
            problems.append(f"'{key}': ['Not a valid string.']")
        elif isinstance(config.get("Build"), dict) and key not in build:
            problems.append(f"'{key}': ['Missing data for required field.']")
    if isinstance(build.get("ParentImage"), str) and not build["ParentImage"].startswith(("ami", "arn")):
        problems.append("'ParentImage': ['String does not match expected pattern.']")
    for component in build.get("Components") or []:
        if not isinstance(component, dict) or component.get("Type") not in ("arn", "script"):
            problems.append("'Type': ['Must be one of: arn, script.']")
    for tag in (config.get("Image") or {}).get("Tags") or []:
        if not isinstance(tag, dict) or set(tag) != {"Key", "Value"}:
            problems.append("'Tags': ['Each tag needs a Key and a Value.']")
    if not problems:
        return []
    return [{"level": "ERROR", "type": "ImageSchemaValidator", "message": "[" + ", ".join(problems) + "]"}]


def _validator_findings(config: dict[str, Any], aws: Aws) -> list[dict[str, str]]:
    build = config["Build"]
    findings = []
    instance_type, parent = build["InstanceType"], build["ParentImage"]
    if not is_known_instance_type(instance_type):
        findings.append({"level": "ERROR", "type": "InstanceTypeBaseAMICompatibleValidator",
                         "message": f"The instance type '{instance_type}' is not supported."})
    if parent.startswith("arn") or not _ami(aws, parent):
        findings.append({"level": "ERROR", "type": "InstanceTypeBaseAMICompatibleValidator",
                         "message": f"Invalid image '{parent}'."})
    for component in build.get("Components") or []:
        if component["Type"] == "arn" or not str(component.get("Value", "")).startswith("s3://"):
            # Image Builder would fetch it from AWS: the local UltraCluster reaches nothing off loopback.
            findings.append({"level": "ERROR", "type": "UrlValidator",
                             "message": f"The local UltraCluster runs script components from S3 (moto) only, not "
                                        f"'{component.get('Value')}'."})
    return findings


def _ami(aws: Aws, ami_id: str) -> dict[str, Any] | None:
    try:
        images = aws.client("ec2").describe_images(ImageIds=[ami_id])["Images"]
    except Exception:
        return None
    return images[0] if images else None


def describe_image(args: argparse.Namespace) -> dict[str, Any]:
    aws = Aws(region_from_env())
    record = read_image(args.image_id)
    built = built_amis(aws, args.image_id)
    if built:
        return describe_built(built[0], args.image_id, _config_url(aws, record), aws.region)
    if record is not None and record["region"] == aws.region:
        return describe_building(record, _config_url(aws, record))
    raise Failure(not_found_message(args.image_id))


def list_images(args: argparse.Namespace) -> dict[str, Any]:
    aws = Aws(region_from_env())
    if args.image_status == "AVAILABLE":
        images = []
        for ami in built_amis(aws):
            tags = _ami_tags(ami)
            images.append({"imageId": tags[IMAGE_ID_TAG], "imageBuildStatus": "BUILD_COMPLETE",
                           "ec2AmiInfo": {"amiId": ami["ImageId"]}, "region": aws.region,
                           "version": tags.get("parallelcluster:version", PCLUSTER_VERSION)})
        return {"images": images}
    wanted = stack_statuses(args.image_status)
    records = [read_image(p.name) for p in sorted(images_root().glob("*")) if p.is_dir()]
    return {"images": [summary(r) for r in records
                       if r and r["region"] == aws.region and r["cloudformationStackStatus"] in wanted]}


def delete_image(args: argparse.Namespace) -> dict[str, Any]:
    image_id = args.image_id
    aws = Aws(region_from_env())
    with _lock(image_id):
        record = read_image(image_id)
        built = built_amis(aws, image_id)
        if not built and (record is None or record["region"] != aws.region):
            raise Failure(not_found_message(image_id))
        if built and not args.force:
            users = _instances_using(aws, built[0]["ImageId"])
            if users:
                raise Failure(f"Bad Request: Unable to delete image and stack: Image {image_id} is used by instances "
                              f"{users}.")
        if record and record.get("buildWorkerPid") and worker_alive(record["buildWorkerPid"]):
            raise Failure("Bad Request: Image cannot be deleted because EC2 ImageBuilder Image has a running "
                          "workflow.")
        stack = aws.stack_exists(image_id)
        if stack:
            aws.delete_stack(image_id)
        for ami in built:
            _deregister(aws, ami)
        if record and record.get("configBucket"):
            try:
                aws.delete_config(record["configBucket"], record["configKey"])
            except ClientError as error:   # as pcluster: a missing bucket's artifacts are skipped
                if error.response["Error"]["Code"] != "NoSuchBucket":
                    raise
        shutil.rmtree(image_dir(image_id), ignore_errors=True)
    version = (_ami_tags(built[0]).get("parallelcluster:version") if built else None) or PCLUSTER_VERSION
    image = {"imageId": image_id, "imageBuildStatus": "DELETE_IN_PROGRESS", "region": aws.region, "version": version}
    if stack and record:
        image.update(cloudformationStackStatus="DELETE_IN_PROGRESS",
                     cloudformationStackArn=record["cloudformationStackArn"])
    return {"image": image}


def _instances_using(aws: Aws, ami_id: str) -> list[str]:
    pages = aws.client("ec2").get_paginator("describe_instances").paginate(Filters=[
        {"Name": "image-id", "Values": [ami_id]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
    return [i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]]


def _deregister(aws: Aws, ami: dict[str, Any]) -> None:
    ec2 = aws.client("ec2")
    ec2.deregister_image(ImageId=ami["ImageId"])
    for mapping in ami.get("BlockDeviceMappings") or []:
        snapshot = (mapping.get("Ebs") or {}).get("SnapshotId")
        if snapshot:
            ec2.delete_snapshot(SnapshotId=snapshot)


def list_official_images(args: argparse.Namespace) -> dict[str, Any]:
    problems = []
    if args.os is not None and args.os not in SUPPORTED_OS:
        problems.append(f"{args.os} is not one of {list(SUPPORTED_OS)}")
    if args.architecture is not None and args.architecture not in ARCHITECTURES:
        problems.append(f"{args.architecture} is not one of {list(ARCHITECTURES)}")
    if problems:
        raise Failure("Bad Request: " + "; ".join(problems))
    aws = Aws(region_from_env())
    images = []
    for os_name in [args.os] if args.os else SUPPORTED_OS:
        for architecture in [args.architecture] if args.architecture else ARCHITECTURES:
            ami = official_ami(aws, os_name, architecture)
            images.append({"amiId": ami["ImageId"], "os": official_os(ami["Name"]), "name": ami["Name"],
                           "architecture": architecture, "version": PCLUSTER_VERSION})
    return {"images": images}


def official_ami(aws: Aws, os_name: str, architecture: str) -> dict[str, Any]:
    """ParallelCluster's AMI of an OS, made in moto the first time it is asked for (moto ships none).
    From an instance of one of moto's own AMIs of that architecture: moto's RegisterImage drops it."""
    name = official_name(os_name, architecture)
    ec2 = aws.client("ec2")
    found = ec2.describe_images(Filters=[{"Name": "name", "Values": [name]}])["Images"]
    if found:
        return found[0]
    base = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": [architecture]}])
    [instance] = ec2.run_instances(ImageId=base["Images"][0]["ImageId"], MinCount=1, MaxCount=1)["Instances"]
    try:
        description = f"AWS ParallelCluster AMI for {os_name} (the local UltraCluster's)"
        ami_id = ec2.create_image(InstanceId=instance["InstanceId"], Name=name, Description=description)["ImageId"]
    finally:
        ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    ec2.create_tags(Resources=[ami_id], Tags=[{"Key": "parallelcluster:version", "Value": PCLUSTER_VERSION},
                                              {"Key": "parallelcluster:os", "Value": os_name}])
    return ec2.describe_images(ImageIds=[ami_id])["Images"][0]


def add_commands(command: Any, image_id: Any, file_text: Any, suppress: Any, boolean: Any) -> None:
    """The image verbs on the CLI's parser (``command`` as cli.build_parser's helper; the others are its
    argument types: the image id's pattern, a file's text, a validator to suppress, a boolean)."""
    build = command("build-image", build_image, "Create a custom ParallelCluster image in a given region.")
    build.add_argument("-c", "--image-configuration", required=True, type=file_text)
    build.add_argument("-i", "--image-id", required=True, type=image_id)
    build.add_argument("--suppress-validators", nargs="+", type=suppress)
    build.add_argument("--validation-failure-level", choices=("INFO", "WARNING", "ERROR"))
    build.add_argument("--dryrun", type=boolean("dryrun"), default=False)
    build.add_argument("--rollback-on-failure", type=boolean("rollback-on-failure"))
    describe = command("describe-image", describe_image, "Get detailed information about an existing image.")
    describe.add_argument("-i", "--image-id", required=True, type=image_id)
    listing = command("list-images", list_images, "Retrieve the list of existing custom images.")
    listing.add_argument("--image-status", required=True, choices=("AVAILABLE", "PENDING", "FAILED"))
    listing.add_argument("--next-token")
    delete = command("delete-image", delete_image, "Initiate the deletion of the custom ParallelCluster image.")
    delete.add_argument("-i", "--image-id", required=True, type=image_id)
    delete.add_argument("--force", type=boolean("force"), default=False)
    official = command("list-official-images", list_official_images, "List Official ParallelCluster AMIs.")
    official.add_argument("--os")
    official.add_argument("--architecture")

