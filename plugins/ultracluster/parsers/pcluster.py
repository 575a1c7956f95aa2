"""Every parse of `pcluster` (ParallelCluster v3 CLI) output, and its typed errors.

pcluster prints JSON on stdout: the result with exit 0, or an error object
``{"message": ..., ["configurationValidationErrors": [...]]}`` with exit 1. The cluster states and
their verdicts are ``run.states``'.
"""
from __future__ import annotations

import json
import re
from typing import Any

import yaml

# Keys of describe-cluster kept in events and XCom: clusterConfiguration.url is a presigned S3 URL.
_DESCRIPTION_KEYS = (
    "clusterName", "clusterStatus", "cloudFormationStackStatus", "cloudformationStackArn", "region",
    "version", "computeFleetStatus", "headNode", "tags", "failures", "scheduler", "creationTime",
)

# pcluster's wording when a cluster is gone (or never existed).
_NOT_FOUND = re.compile(r"does not exist", re.IGNORECASE)
_ALREADY_EXISTS = re.compile(r"already exists", re.IGNORECASE)
# ...and an image (image_operations_controller: NotFoundException; ImageBuilder's ConflictImageBuilderActionError).
_IMAGE_NOT_FOUND = re.compile(r"^No image or stack associated with ParallelCluster image id")
_IMAGE_EXISTS = re.compile(r"^ParallelCluster (image|build infrastructure for image) \S+ .*already exists")

# create-cluster --dryrun true (pcluster's create-cluster controller): a config it would accept is an
# error too, exit 1 with this message (plus validationMessages for warnings); a config it refuses is
# ClusterValidationError, or a plain 400 whose message starts as below (a subnet that does not exist,
# a bad cluster name, no official AMI). Anything else (throttling, a failed AWS call) may pass on a retry.
DRYRUN_SUCCEEDED = "Request would have succeeded, but DryRun flag is set."
_CONFIG_REFUSED = re.compile(r"^(Bad Request|Invalid cluster configuration)\b")

# AWS refused one of pcluster's own calls: pcluster prints the service's message without its code.
# IAM's wording names the action ("... is not authorized to perform: cloudformation:DescribeStacks on
# resource: ...", "... because no identity-based policy allows the s3:GetObject action"); EC2's
# UnauthorizedOperation and S3's plain "Access Denied" do not.
_DENIED = re.compile(r"not authorized to perform|\bAccessDenied|\bAccess Denied\b|UnauthorizedOperation",
                     re.IGNORECASE)
_DENIED_ACTION = re.compile(r"(?:not authorized to perform:?|policy allows the)\s+([a-z0-9-]+:[A-Za-z0-9*]+)")

# Longest stderr tail kept in an error: enough to diagnose, short enough for a log line.
_STDERR_TAIL_CHARS = 2000

# Presigned S3 URLs (describe-cluster's clusterConfiguration.url) are secrets: errors reach logs.
_SIGNED_URL = re.compile(r"https?://[^\s\"'<>]*?(?:X-Amz-Signature|Signature)=[^\s\"'<>]*", re.IGNORECASE)
# A tail cut inside a URL loses its scheme: drop the signing values themselves too.
_SIGNING_PARAM = re.compile(
    r"(X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|AWSAccessKeyId|x-amz-security-token)"
    r"=[^&\s\"'<>]*",
    re.IGNORECASE,
)


def redact_signed_urls(text: str) -> str:
    """``text`` with every presigned URL (and any stray signing parameter) replaced."""
    text = _SIGNED_URL.sub("<redacted presigned URL>", text)
    return _SIGNING_PARAM.sub(r"\1=<redacted>", text)


class PclusterError(Exception):
    """pcluster failed; ``message`` is pcluster's own text, ``payload`` its parsed JSON (or {})."""

    def __init__(self, message: str, exit_code: int | None = None, payload: dict | None = None):
        message = redact_signed_urls(message)
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.payload = payload or {}

    def __str__(self) -> str:
        return self.message


class ClusterNotFoundError(PclusterError):
    """The cluster does not exist (or belongs to another ParallelCluster major version)."""


class ClusterAlreadyExistsError(PclusterError):
    """create-cluster was refused because a cluster with that name exists."""


class ImageNotFoundError(PclusterError):
    """No image and no build stack of that image id (describe-image, delete-image)."""


class ImageAlreadyExistsError(PclusterError):
    """build-image was refused: an image, or a build stack, of that id exists."""


class PclusterAccessDeniedError(PclusterError):
    """AWS denied a call pcluster made as the pcluster role: the same call is denied again until the
    role's policy changes. ``action`` is the IAM action AWS named (None when its message names none).
    It answers ``response`` as botocore's ClientError does, so ``run.errors.denial_in`` finds it and
    the DAG's retry policy fails the task at once (operators.retry_policy)."""

    def __init__(self, message: str, exit_code: int | None = None, payload: dict | None = None):
        super().__init__(message, exit_code, payload)
        found = _DENIED_ACTION.search(self.message)
        self.action: str | None = found.group(1) if found else None
        self.response = {"Error": {"Code": "AccessDenied", "Message": str(self)}}

    def __str__(self) -> str:
        denied = f"AWS denied pcluster's {self.action}" if self.action else "AWS denied one of pcluster's calls"
        return f"{denied} (the pcluster_default connection's role lacks it; not retried): {self.message}"


class ClusterValidationError(PclusterError):
    """pcluster rejected the configuration; details in ``configuration_validation_errors``."""

    def __init__(self, message: str, exit_code: int | None = None, payload: dict | None = None):
        super().__init__(message, exit_code, payload)
        self.configuration_validation_errors: list[dict] = list(
            (payload or {}).get("configurationValidationErrors") or []
        )

    def __str__(self) -> str:
        details = "; ".join(
            f"{e.get('level', '?')} {e.get('type', '?')}: {e.get('message', '')}"
            for e in self.configuration_validation_errors
        )
        return redact_signed_urls(f"{self.message} {details}".strip())


def _decode_json(text: str) -> Any:
    """Decode pcluster's JSON; it may print log lines before it, so fall back to the first '{'."""
    text = text.strip()
    if not text:
        raise ValueError("empty output")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        start = text.find("{")
        if start < 0:
            raise
        return json.loads(text[start:])


def parse_cli_result(returncode: int, stdout: str, stderr: str) -> dict:
    """Turn one pcluster invocation into its JSON dict, or raise the matching typed error."""
    try:
        payload = _decode_json(stdout)
    except ValueError:
        payload = None
    if returncode == 0 and isinstance(payload, dict):
        return payload
    if returncode == 0:
        # Redact before cutting: a whole URL is recognised by its scheme.
        raise PclusterError(
            f"pcluster exited 0 but did not print a JSON object: "
            f"{redact_signed_urls(stdout)[-_STDERR_TAIL_CHARS:]!r}",
            exit_code=returncode,
        )
    if not isinstance(payload, dict):
        tail = redact_signed_urls((stderr or stdout or "").strip())[-_STDERR_TAIL_CHARS:]
        raise PclusterError(f"pcluster exited {returncode}: {tail}", exit_code=returncode)

    message = str(payload.get("message") or f"pcluster exited {returncode}")
    if payload.get("configurationValidationErrors"):
        raise ClusterValidationError(message, returncode, payload)
    if _DENIED.search(message):
        raise PclusterAccessDeniedError(message, returncode, payload)
    if _IMAGE_NOT_FOUND.match(message):
        raise ImageNotFoundError(message, returncode, payload)
    if _IMAGE_EXISTS.match(message):
        raise ImageAlreadyExistsError(message, returncode, payload)
    if _NOT_FOUND.search(message):
        raise ClusterNotFoundError(message, returncode, payload)
    if _ALREADY_EXISTS.search(message):
        raise ClusterAlreadyExistsError(message, returncode, payload)
    raise PclusterError(message, returncode, payload)


def dryrun_succeeded(error: PclusterError) -> bool:
    """True when ``error`` is a dry run's "would have succeeded" answer."""
    return error.message.strip() == DRYRUN_SUCCEEDED and not isinstance(error, ClusterValidationError)


def config_refused(error: PclusterError) -> bool:
    """True when pcluster refused the configuration itself: the same config fails again on a retry."""
    return isinstance(error, ClusterValidationError) or bool(_CONFIG_REFUSED.match(error.message.strip()))


def cluster_status(description: dict) -> str:
    """clusterStatus from describe-cluster, or create/delete's nested ``cluster`` object."""
    cluster = description.get("cluster", description)
    return str(cluster.get("clusterStatus") or "")


def stack_arn(description: dict) -> str | None:
    cluster = description.get("cluster", description)
    return cluster.get("cloudformationStackArn")


def public_description(description: dict) -> dict:
    """describe-cluster output minus anything secret, safe for events, logs and XCom."""
    return {k: description[k] for k in _DESCRIPTION_KEYS if k in description}


def failures(description: dict) -> list[dict]:
    """failures[] of a CREATE_FAILED cluster (pcluster >= 3.5), else the legacy failureReason."""
    found = list(description.get("failures") or [])
    if not found and description.get("failureReason"):
        found = [{"failureCode": "Unknown", "failureReason": description["failureReason"]}]
    return found


def head_node_address(description: dict) -> str | None:
    """Public IP of the head node (the SSH target), else its private IP."""
    head = description.get("headNode") or {}
    return head.get("publicIpAddress") or head.get("privateIpAddress")


def cluster_facts(description: dict) -> dict[str, Any]:
    """What the fleet wait judges (``run.fleet.judge_cluster``), from describe-cluster."""
    return {"name": description.get("clusterName", "?"), "status": cluster_status(description),
            "fleet_status": str(description.get("computeFleetStatus") or ""), "failures": failures(description),
            "head_node_address": head_node_address(description)}


def cluster_identity(description: dict) -> str:
    """What tells one creation of a cluster from a later one of the same name (the stack ARN holds a
    per-stack UUID; creation time and head node instance are there in case it is missing)."""
    head = description.get("headNode") or {}
    parts = (stack_arn(description), description.get("creationTime"), head.get("instanceId"))
    return "|".join(str(part or "") for part in parts)


def region_from_arn(arn: str | None) -> str | None:
    """``arn:aws:cloudformation:<region>:<account>:stack/<name>/<id>`` -> region."""
    parts = (arn or "").split(":")
    return parts[3] if len(parts) > 4 else None


# --- a cluster's configuration (the YAML describe-cluster's clusterConfiguration.url serves)

# ParallelCluster's default of ComputeResources[].MaxCount when a config leaves it out.
DEFAULT_MAX_COUNT = 10


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def config_facts(config_yaml: str) -> dict[str, Any]:
    """What a run needs to know of a cluster's ParallelCluster v3 config: ``{"queues": {queue:
    [{"name", "instance_types", "min_count", "max_count"}]}, "mount_dirs": [...], "accounting": bool}``.
    A compute resource names one ``InstanceType`` or several under ``Instances`` (flexible types).
    Raises ValueError for text that is not a config."""
    try:
        config = yaml.safe_load(config_yaml)
    except yaml.YAMLError as err:
        raise ValueError(f"the cluster's configuration is not YAML: {err}") from None
    if not isinstance(config, dict):
        raise ValueError("the cluster's configuration is not a YAML mapping")
    scheduling = config.get("Scheduling") if isinstance(config.get("Scheduling"), dict) else {}
    queues: dict[str, list[dict[str, Any]]] = {}
    for queue in _list(scheduling.get("SlurmQueues")):
        resources = []
        for resource in _list(queue.get("ComputeResources")) if isinstance(queue, dict) else []:
            if not isinstance(resource, dict):
                continue
            types = [resource["InstanceType"]] if resource.get("InstanceType") else [
                i.get("InstanceType") for i in _list(resource.get("Instances")) if isinstance(i, dict)]
            resources.append({"name": resource.get("Name"), "instance_types": [t for t in types if t],
                              "min_count": int(resource.get("MinCount") or 0),
                              "max_count": int(resource.get("MaxCount", DEFAULT_MAX_COUNT))})
        if isinstance(queue, dict) and queue.get("Name"):
            queues[str(queue["Name"])] = resources
    settings = scheduling.get("SlurmSettings") if isinstance(scheduling.get("SlurmSettings"), dict) else {}
    return {"queues": queues,
            "mount_dirs": [s["MountDir"] for s in _list(config.get("SharedStorage"))
                           if isinstance(s, dict) and s.get("MountDir")],
            "accounting": bool(settings.get("Database"))}


# --- stack events and head node logs (get-cluster-stack-events, list-cluster-log-streams, get-cluster-log-events)

# Head node streams holding its bootstrap, as the cookbook's CloudWatch agent config names them
# (<short private DNS name>.<instance id>.<log>): cfn-init runs the custom actions (OnNodeStart,
# OnNodeConfigured), chef-client the rest; cloud-init-output is collected on the head node only by
# older versions, cloud-init is the last resort.
CFN_INIT_LOG, CHEF_CLIENT_LOG = "cfn-init", "chef-client"
BOOTSTRAP_LOGS = (CHEF_CLIENT_LOG, CFN_INIT_LOG, "cloud-init-output", "cloud-init")
HEAD_NODE_LOG_FILTER = "Name=node-type,Values=HeadNode"
_CUSTOM_ACTION_CODES = ("OnNodeStart", "OnNodeConfigured")
# failureCodes the configuration causes (custom action scripts, the AMI, shared storage settings):
# creating the same cluster again fails the same way. Capacity, timeouts and unknown causes may pass.
CONFIG_FAILURE_CODES = frozenset({
    "OnNodeStartExecutionFailure", "OnNodeStartDownloadFailure", "OnNodeStartFailure",
    "OnNodeConfiguredExecutionFailure", "OnNodeConfiguredDownloadFailure", "OnNodeConfiguredFailure",
    "AmiVersionMismatch", "InvalidAmi", "EbsMountFailure", "EfsMountFailure", "FsxMountFailure", "RaidMountFailure",
})


def is_config_failure(found: list[dict]) -> bool:
    return any(f.get("failureCode") in CONFIG_FAILURE_CODES for f in found)


def failed_stack_events(events: list[dict], limit: int = 5) -> list[dict]:
    """The newest ``limit`` events whose resourceStatus is a *_FAILED one, newest first."""
    failed = [e for e in events if str(e.get("resourceStatus") or "").endswith("_FAILED")]
    return sorted(failed, key=lambda e: str(e.get("timestamp") or ""), reverse=True)[:limit]


def describe_stack_event(event: dict) -> str:
    return redact_signed_urls(
        f"{event.get('timestamp', '?')} {event.get('logicalResourceId', '?')} ({event.get('resourceType', '?')}) "
        f"{event.get('resourceStatus', '?')}: {event.get('resourceStatusReason') or 'no reason given'}")


def bootstrap_log_stream(streams: list[dict], found: list[dict] | None = None) -> str | None:
    """Name of the head node stream to tail: cfn-init first for a custom action failure, else chef-client."""
    names = [str(s.get("logStreamName") or "") for s in streams]
    order = BOOTSTRAP_LOGS
    if any(str(f.get("failureCode") or "").startswith(_CUSTOM_ACTION_CODES) for f in found or []):
        order = (CFN_INIT_LOG, *[log for log in BOOTSTRAP_LOGS if log != CFN_INIT_LOG])
    for log in order:
        for name in names:
            if name.endswith("." + log):
                return name
    return None


def log_event_messages(payload: dict) -> list[str]:
    """get-cluster-log-events' messages in time order, secrets redacted."""
    return [redact_signed_urls(str(e.get("message", "")).rstrip("\n")) for e in payload.get("events") or []]


# --- images (build-image, describe-image, list-images, delete-image)

def image_status(description: dict) -> str:
    """imageBuildStatus from describe-image, or build/delete's nested ``image`` summary."""
    return str(description.get("image", description).get("imageBuildStatus") or "")


def image_ami(description: dict) -> str | None:
    return (description.get("image", description).get("ec2AmiInfo") or {}).get("amiId")


def image_tags(description: dict) -> dict[str, str]:
    """The AMI's tags (describe-image's ec2AmiInfo.tags, BUILD_COMPLETE only)."""
    return {t["key"]: t.get("value", "") for t in (description.get("ec2AmiInfo") or {}).get("tags") or []}


def image_failure(description: dict) -> str:
    """Why a build failed, as describe-image tells it (Image Builder's reason, else the stack's)."""
    reasons = [description.get(k) for k in ("imagebuilderImageStatusReason", "cloudformationStackStatusReason")]
    return redact_signed_urls("; ".join(r for r in reasons if r) or "no reason given")


def public_image_description(description: dict) -> dict:
    """describe-image without its presigned imageConfiguration URL, safe for events, logs and XCom."""
    return {k: v for k, v in description.items() if k != "imageConfiguration"}
