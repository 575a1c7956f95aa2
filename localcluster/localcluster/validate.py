"""Validation of a ParallelCluster v3 config, in pcluster's order and with its messages.

1. YAML -> dict            ("Bad Request: Configuration must be a valid YAML document. ...")
2. structure (JSON Schema)  one ConfigSchemaValidator error, marshmallow-style message
3. AWS lookups              instance types, subnets (plain "Invalid cluster configuration: ..." message)
4. validators               NameValidator, DuplicateNameValidator, ... collected, then judged by level
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from .config_schema import CLUSTER_SCHEMA, RETIRED_OS
from .instance_types import is_known_instance_type
from .shapes import validation_error

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

LEVELS = ("INFO", "WARNING", "ERROR")
MAX_QUEUES = 50
MAX_COMPUTE_RESOURCES = 50
QUEUE_NAME_MAX = 25
CLUSTER_NAME_MAX = 60
CLUSTER_NAME_MAX_WITH_ACCOUNTING = 40
MAX_NEW_FSX = 1
_NAME_RE = re.compile(r"^[a-z][a-z0-9\-]*$")


class ConfigRejected(Exception):
    """Carries the exact JSON pcluster prints for this rejection."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__(payload.get("message", ""))
        self.payload = payload


class AwsLookups(Protocol):
    def key_pair_exists(self, key_name: str) -> bool: ...
    def subnet_vpc(self, subnet_id: str) -> str | None: ...


def load_yaml(text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigRejected({"message": f"Bad Request: Configuration must be a valid YAML document. {error}"})
    if not isinstance(data, dict):
        raise ConfigRejected({"message": "Bad Request: Configuration must be a valid YAML document. "
                                         "Parsed config is not a dict"})
    return data


# --- 2. structure --------------------------------------------------------------------------------

def _schema_message(error: ValidationError) -> tuple[list[Any], str]:
    """Path and marshmallow wording for one JSON Schema error."""
    path = list(error.absolute_path)
    kind = error.validator
    if kind == "required":
        missing = re.findall(r"'([^']+)' is a required property", error.message)
        return path + missing[:1], "Missing data for required field."
    if kind == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return path + extra[:1], "Unknown field."
    if kind == "enum":
        return path, f"Must be one of: {', '.join(str(v) for v in error.validator_value)}."
    if kind == "minimum":
        return path, f"Must be greater than or equal to {error.validator_value}."
    if kind == "maximum":
        return path, f"Must be less than or equal to {error.validator_value}."
    if kind == "minItems":
        return path, f"Shorter than minimum length {error.validator_value}."
    if kind == "maxItems":
        return path, f"Longer than maximum length {error.validator_value}."
    if kind == "type" and error.instance is None:
        return path, "Field may not be null."
    if kind == "type":
        wanted = error.validator_value if isinstance(error.validator_value, str) else error.validator_value[0]
        words = {"integer": "Not a valid integer.", "number": "Not a valid number.", "string": "Not a valid string.",
                 "boolean": "Not a valid boolean.", "array": "Not a valid list.", "object": "Invalid input type."}
        return path, words.get(wanted, "Invalid value.")
    return path, error.message


def _nest(messages: dict[Any, Any], path: list[Any], text: str) -> None:
    """Place text at path the way marshmallow nests its error messages."""
    path = path or ["_schema"]
    node = messages
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return
    node.setdefault(path[-1], [])
    if isinstance(node[path[-1]], list):
        node[path[-1]].append(text)


def check_structure(config: dict[str, Any]) -> None:
    from jsonschema import Draft202012Validator  # here: every pcluster call but the creates skips its import

    errors = list(Draft202012Validator(CLUSTER_SCHEMA).iter_errors(config))
    if not errors:
        return
    messages: dict[Any, Any] = {}
    for error in errors:
        path, text = _schema_message(error)
        _nest(messages, path, text)
    raise ConfigRejected({
        "configurationValidationErrors": [
            validation_error("ERROR", "ConfigSchemaValidator", str(sorted(messages.items())))],
        "message": "Invalid cluster configuration.",
    })


# --- 3. lookups that pcluster does while loading the config ----------------------------------------

def _queues(config: dict[str, Any]) -> list[dict[str, Any]]:
    return config["Scheduling"]["SlurmQueues"]


def _instance_types(config: dict[str, Any]) -> list[str]:
    types = [config["HeadNode"]["InstanceType"]]
    for queue in _queues(config):
        for resource in queue["ComputeResources"]:
            types.extend(_resource_types(resource))
    return types


def _resource_types(resource: dict[str, Any]) -> list[str]:
    if "InstanceType" in resource:
        return [resource["InstanceType"]]
    return [i.get("InstanceType", "") for i in resource.get("Instances", [])]


def check_lookups(config: dict[str, Any], aws: AwsLookups | None) -> dict[str, str]:
    """Returns subnet -> VPC id. Raises with pcluster's plain message on unknown types or subnets."""
    unknown = sorted({t for t in _instance_types(config) if not is_known_instance_type(t)})
    if unknown:
        raise ConfigRejected({"message": "Invalid cluster configuration: The following supplied instance types "
                                         f"do not exist: [{', '.join(unknown)}]"})
    vpcs: dict[str, str] = {}
    if aws is None:
        return vpcs
    subnets = [config["HeadNode"]["Networking"]["SubnetId"]]
    subnets += [s for q in _queues(config) for s in q["Networking"]["SubnetIds"]]
    for subnet in dict.fromkeys(subnets):
        vpc = aws.subnet_vpc(subnet)
        if vpc is None:
            raise ConfigRejected({"message": f"Invalid cluster configuration: The subnet ID '{subnet}' does not exist"})
        vpcs[subnet] = vpc
    return vpcs


# --- 4. validators -----------------------------------------------------------------------------

Finding = dict[str, str]


def _name_findings(name: str) -> list[Finding]:
    if not _NAME_RE.match(name):
        return [validation_error("ERROR", "NameValidator",
                                 f"Invalid name '{name}'. Name must begin with a letter and only contain "
                                 "lowercase letters, digits and hyphens.")]
    if len(name) > QUEUE_NAME_MAX:
        return [validation_error("ERROR", "NameValidator",
                                 f"Invalid name '{name}'. Name can be at most {QUEUE_NAME_MAX} chars long.")]
    return []


def _duplicates(values: list[str]) -> list[str]:
    return [v for v, count in Counter(values).items() if count > 1]


def cluster_name_findings(cluster_name: str, config: dict[str, Any]) -> list[Finding]:
    accounting = "Database" in (config["Scheduling"].get("SlurmSettings") or {})
    limit = CLUSTER_NAME_MAX_WITH_ACCOUNTING if accounting else CLUSTER_NAME_MAX
    if re.match(rf"^([a-zA-Z][a-zA-Z0-9-]{{0,{limit - 1}}})$", cluster_name):
        return []
    when = "when using Slurm accounting it can't be longer" if accounting else "can't be longer"
    return [validation_error("ERROR", "ClusterNameValidator",
                             "Error: The cluster name can contain only alphanumeric characters (case-sensitive) "
                             f"and hyphens. It must start with an alphabetic character and {when} than {limit} "
                             "characters.")]


def queue_findings(config: dict[str, Any]) -> list[Finding]:
    queues = _queues(config)
    found: list[Finding] = []
    if len(queues) > MAX_QUEUES:
        found.append(validation_error("ERROR", "MaxCountValidator",
                                      f"Invalid number of SlurmQueues ({len(queues)}) specified. Currently only "
                                      f"supports up to {MAX_QUEUES} SlurmQueues."))
    total_resources = sum(len(q["ComputeResources"]) for q in queues)
    if total_resources > MAX_COMPUTE_RESOURCES:
        found.append(validation_error("ERROR", "MaxCountValidator",
                                      f"Invalid number of ComputeResources per Cluster ({total_resources}) specified. "
                                      f"Currently only supports up to {MAX_COMPUTE_RESOURCES} ComputeResources per "
                                      "Cluster."))
    for name in _duplicates([q["Name"] for q in queues]):
        found.append(validation_error("ERROR", "DuplicateNameValidator", f"Queue name {name} must be unique."))
    for queue in queues:
        found.extend(_name_findings(queue["Name"]))
        resources = queue["ComputeResources"]
        for name in _duplicates([r["Name"] for r in resources]):
            found.append(validation_error("ERROR", "DuplicateNameValidator",
                                          f"Compute resource name {name} must be unique."))
        for resource in resources:
            found.extend(_name_findings(resource["Name"]))
            if resource.get("MinCount", 0) > resource.get("MaxCount", 10):
                found.append(validation_error("ERROR", "ComputeResourceSizeValidator",
                                              "Max count must be greater than or equal to min count."))
            if not _resource_types(resource):
                found.append(validation_error("ERROR", "InstanceTypeValidator",
                                              f"Compute resource {resource['Name']} has neither InstanceType "
                                              "nor Instances."))
    return found


def storage_findings(config: dict[str, Any]) -> list[Finding]:
    storages = config.get("SharedStorage") or []
    found = [validation_error("ERROR", "DuplicateNameValidator", f"Shared Storage name {name} must be unique.")
             for name in _duplicates([s["Name"] for s in storages])]
    new_fsx = [s for s in storages if s["StorageType"] == "FsxLustre"
               and not (s.get("FsxLustreSettings") or {}).get("FileSystemId")]
    if len(new_fsx) > MAX_NEW_FSX:
        found.append(validation_error("ERROR", "NumberOfStorageValidator",
                                      "Too many new FSx shared storage specified in the configuration. "
                                      f"ParallelCluster supports {MAX_NEW_FSX} new FSx."))
    for mount in _duplicates([s["MountDir"] for s in storages]):
        users = [s["Name"] for s in storages if s["MountDir"] == mount]
        found.append(validation_error(
            "ERROR", "DuplicateMountDirValidator",
            f"The mount directory `{mount}` is used for multiple shared storage: {users}. Shared storage mount "
            "directories should be unique. Please change the mount directory configuration of the shared "
            "storage."))
    return found


def key_pair_findings(config: dict[str, Any], aws: AwsLookups | None) -> list[Finding]:
    key_name = (config["HeadNode"].get("Ssh") or {}).get("KeyName")
    if not key_name:
        # pcluster only warns here; a local cluster without a key cannot be reached, so it is an error.
        return [validation_error("ERROR", "KeyPairValidator",
                                 "If you do not specify a key pair, you can't connect to the instance unless you "
                                 "choose an AMI that is configured to allow users another way to log in")]
    if aws is not None and not aws.key_pair_exists(key_name):
        return [validation_error("ERROR", "KeyPairValidator", f"The keypair '{{'{key_name}'}}' does not exist.")]
    return []


def os_findings(config: dict[str, Any]) -> list[Finding]:
    os_name = config["Image"]["Os"]
    if os_name in RETIRED_OS:
        return [validation_error("WARNING", "LocalUltraClusterOsValidator",
                                 f"Os '{os_name}' is not accepted by ParallelCluster 3.16.1 (it allows alinux2023, "
                                 "ubuntu2204, ubuntu2404, rhel8, rocky8, rhel9, rocky9); the local UltraCluster "
                                 "accepts it.")]
    return []


def run_validators(cluster_name: str, config: dict[str, Any], aws: AwsLookups | None,
                   extra: Sequence[Callable[[], list[Finding]]] = ()) -> list[Finding]:
    found: list[Finding] = []
    found += cluster_name_findings(cluster_name, config)
    found += queue_findings(config)
    found += storage_findings(config)
    found += key_pair_findings(config, aws)
    found += os_findings(config)
    for validator in extra:
        found += validator()
    return found


# Bad fault tags cannot be built into a ClusterSpec at all, so they are never suppressed.
UNSUPPRESSIBLE = {"LocalUltraClusterFaultValidator"}


def suppressed(finding: Finding, suppress: list[str]) -> bool:
    if finding["type"] in UNSUPPRESSIBLE:
        return False
    return "ALL" in suppress or f"type:{finding['type']}" in suppress


def judge(findings: list[Finding], suppress: list[str], failure_level: str = "ERROR") -> list[Finding]:
    """Raise with every kept finding when one reaches failure_level; else return them (validationMessages)."""
    kept = [f for f in findings if not suppressed(f, suppress)]
    threshold = LEVELS.index(failure_level)
    if any(LEVELS.index(f["level"]) >= threshold for f in kept):
        raise ConfigRejected({"configurationValidationErrors": kept, "message": "Invalid cluster configuration."})
    return kept
