"""`pcluster`: the ParallelCluster v3 CLI subset the project uses, backed by the local UltraCluster
(the image verbs: images.py).

Output mirrors pcluster 3.16.1: JSON (indent 2) on stdout and exit 0; an error is JSON with a
"message" and exit 1; argparse usage errors exit 2 with usage on stderr, as pcluster's argparse does.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import jmespath
from botocore.exceptions import BotoCoreError, EndpointConnectionError

from . import cluster_logs, images, shapes, state, validate
from .cli_args import (
    SUPPRESS_PATTERN,
    Failure,
    _add_common,
    _add_name,
    _boolean,
    _file_text,
    _matching,
    resolve_region as _region,
)
from .aws import FAKE_CREDENTIALS, Aws, LogGroupExists, NotLoopback, region_from_env
from .spec import ClusterSpec, default_user
from .spec_builder import build_spec, config_tags, fault_findings
from .worker import spawn, worker_alive

FLEET_REQUESTS = ("START_REQUESTED", "STOP_REQUESTED", "ENABLED", "DISABLED")
DRYRUN_MESSAGE = "Request would have succeeded, but DryRun flag is set."
UNEXPECTED = ("Unexpected fatal exception. Please look at the application logs for details on the "
              "encountered failure.")


# --- helpers ---------------------------------------------------------------------------------------

def _read_state(name: str, any_region: bool = False) -> dict[str, Any] | None:
    """The cluster's state, or None; like pcluster, a cluster exists only in its own region."""
    # Under the lock: a delete worker briefly removes and rewrites the cluster dir.
    with state.cluster_lock(name):
        try:
            current = state.read_state(name)
        except state.ClusterNotFound:
            return None
        if _settle_dead_worker(current):
            state.write_json_atomic(state.state_file(name), current)
    if not any_region and current["region"] != region_from_env():
        return None
    return current


def _settle_dead_worker(current: dict[str, Any]) -> bool:
    """A worker that died mid-way (killed, reboot) would leave the cluster in progress forever: fail it,
    as CloudFormation times out. Workers write their final state before exiting, so this is no race."""
    stack_status = current["cloudFormationStackStatus"]
    if stack_status == "CREATE_IN_PROGRESS" and not current.get("deleteRequested") \
            and current.get("createWorkerPid") and not worker_alive(current["createWorkerPid"]):
        current.update(cloudFormationStackStatus="ROLLBACK_COMPLETE" if current.get("rollbackOnFailure", True)
                       else "CREATE_FAILED", failureCode="HeadNodeBootstrapFailure",
                       failureReason="Cluster creation timed out.", lastUpdatedTime=shapes.iso_now())
        return True
    if stack_status == "DELETE_IN_PROGRESS" and current.get("deleteWorkerPid") \
            and not worker_alive(current["deleteWorkerPid"]):
        current.update(cloudFormationStackStatus="DELETE_FAILED", deleteRequested=False,
                       lastUpdatedTime=shapes.iso_now())
        return True
    return False


def _require_state(name: str, suffix: str = "") -> dict[str, Any]:
    current = _read_state(name)
    if current is None:
        raise Failure(shapes.not_found_message(name, suffix))
    return current


def _runtime_view(name: str) -> dict[str, Any] | None:
    """describe_runtime() of a provisioned cluster, or None."""
    directory = state.cluster_dir(name)
    if not (directory / "runtime.json").is_file():
        return None
    try:
        from .runtime import describe_runtime
        return describe_runtime(directory)
    except Exception:
        return None   # torn down meanwhile, or runtime not installed


def _fleet_status(current: dict[str, Any], runtime: dict[str, Any] | None) -> str:
    if current.get("fleetRequestPending"):
        live = (runtime or {}).get("compute_fleet_status")
        return live if live in ("STOPPING", "STARTING") else current["computeFleetStatus"]
    if shapes.cluster_status_of(current["cloudFormationStackStatus"]) in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        return (runtime or {}).get("compute_fleet_status") or current["computeFleetStatus"]
    return current["computeFleetStatus"]


def _head_node(runtime: dict[str, Any] | None) -> dict[str, Any] | None:
    if not runtime:
        return None
    head = runtime["head_node"]
    return {"instanceId": head["instance_id"], "instanceType": head.get("instance_type"),
            "launchTime": head["launch_time"], "privateIpAddress": head["ip"], "publicIpAddress": head["ip"],
            "state": head["state"]}


# --- commands --------------------------------------------------------------------------------------

def create_cluster(args: argparse.Namespace) -> dict[str, Any]:
    text: str = args.cluster_configuration
    config = validate.load_yaml(text)
    region = _region(args.region, config.get("Region") if isinstance(config.get("Region"), str) else None)
    aws = Aws(region)
    name: str = args.cluster_name
    # Cluster dirs are keyed by name alone, so a name is taken in every region here.
    if _read_state(name, any_region=True) is not None or aws.stack_exists(name):
        raise Failure(f"Bad Request: Cluster {name} already exists.")
    validate.check_structure(config)
    vpcs = validate.check_lookups(config, aws)
    findings = validate.run_validators(name, config, aws, [partial(fault_findings, config, os.environ)])
    kept = validate.judge(findings, args.suppress_validators or [], args.validation_failure_level or "ERROR")
    if args.dryrun:
        raise Failure({**({"validationMessages": kept} if kept else {}), "message": DRYRUN_MESSAGE})
    spec = build_spec(name, region, config, text, os.environ)
    return _start_creation(name, region, spec, config, kept, vpcs, aws, args.rollback_on_failure is not False)


def _start_creation(name: str, region: str, spec: ClusterSpec, config: dict[str, Any], kept: list[dict[str, str]],
                    vpcs: dict[str, str], aws: Aws, rollback: bool) -> dict[str, Any]:
    now = shapes.iso_now()
    tags = [("parallelcluster:version", shapes.PCLUSTER_VERSION), ("parallelcluster:cluster-name", name)]
    tags += config_tags(config)
    initial = {
        "clusterName": name, "region": region, "version": shapes.PCLUSTER_VERSION,
        "cloudFormationStackStatus": "CREATE_IN_PROGRESS", "cloudformationStackArn": "",
        "creationTime": now, "lastUpdatedTime": now, "computeFleetStatus": "UNKNOWN",
        "stackTags": tags, "rollbackOnFailure": rollback, "deleteRequested": False,
    }
    try:
        directory = state.reserve_cluster(name, initial)
    except state.ClusterExists:
        raise Failure(f"Bad Request: Cluster {name} already exists.") from None
    try:
        (directory / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2))
        bucket, key = aws.upload_config(name, spec.config_yaml)
        head_vpc = vpcs.get(config["HeadNode"]["Networking"]["SubnetId"])
        arn = aws.create_stack(name, head_vpc, tags, bucket, key, state.uc_home().resolve(),
                               default_user(spec.image_os),
                               (spec.log_retention_days, spec.log_deletion_policy) if spec.log_group else None)
    except BaseException as error:
        shutil.rmtree(directory, ignore_errors=True)   # nothing half-made survives a failed create
        if isinstance(error, LogGroupExists):
            raise Failure(f"Bad Request: CloudWatch log group {error} already exists (kept by an earlier cluster "
                          "of this name: Monitoring.Logs.CloudWatch.DeletionPolicy Retain).") from None
        raise
    state.record("created", name, dict(tags))
    with state.update_state(name) as current:
        current.update(cloudformationStackArn=arn, configBucket=bucket, configKey=key)
        cluster_logs.stack_started(directory, name, arn)
        current["createWorkerPid"] = spawn("create", directory)
        summary = shapes.cluster_summary(current)
    return {"cluster": summary, **({"validationMessages": kept} if kept else {})}


def describe_cluster(args: argparse.Namespace) -> dict[str, Any]:
    current = _require_state(args.cluster_name)
    aws = Aws(current["region"])
    try:
        url = aws.presigned_config_url(current["configBucket"], current["configKey"])
    except Exception:
        url = "NOT_AVAILABLE"   # as pcluster when the bucket cannot be read
    runtime = _runtime_view(args.cluster_name)
    current = dict(current, computeFleetStatus=_fleet_status(current, runtime))
    return shapes.describe_cluster(current, url, _head_node(runtime))


def list_clusters(args: argparse.Namespace) -> dict[str, Any]:
    wanted = set(args.cluster_status or [])
    clusters = []
    for name in state.list_cluster_names():
        current = _read_state(name)
        if current is None:
            continue
        summary = shapes.cluster_summary(current)
        if not wanted or summary["clusterStatus"] in wanted:
            clusters.append(summary)
    return {"clusters": clusters}


def delete_cluster(args: argparse.Namespace) -> dict[str, Any]:
    name = args.cluster_name
    with state.cluster_lock(name):
        try:
            current = state.read_state(name)
        except state.ClusterNotFound:
            current = None
        if current is None or current["region"] != region_from_env():
            raise Failure(shapes.not_found_message(name, shapes.DELETE_NOT_FOUND_SUFFIX))
        already = current["cloudFormationStackStatus"] == "DELETE_IN_PROGRESS"
        if not already:
            current.update(cloudFormationStackStatus="DELETE_IN_PROGRESS", deleteRequested=True,
                           lastUpdatedTime=shapes.iso_now(), deleteWorkerPid=None)
            state.write_json_atomic(state.state_file(name), current)
    if not already:
        log = state.uc_home() / "logs" / f"{name}-delete.log"
        pid = spawn("delete", state.cluster_dir(name), log_file=log)
        with state.update_state(name) as latest:
            latest["deleteWorkerPid"] = pid
    return {"cluster": shapes.cluster_summary(current)}


def describe_cluster_instances(args: argparse.Namespace) -> dict[str, Any]:
    if _read_state(args.cluster_name) is None:
        return {"instances": []}   # pcluster filters EC2 by tag: an unknown cluster has none
    runtime = _runtime_view(args.cluster_name)
    instances = []
    for raw in (runtime or {}).get("instances", []):
        if args.node_type and raw.get("nodeType") != args.node_type:
            continue
        if args.queue_name and raw.get("queueName") != args.queue_name:
            continue
        entry = shapes.instance_entry(raw)
        if entry.get("nodeType") != "LoginNode":
            entry.pop("poolName", None)   # pcluster sets poolName only for login nodes
        if entry.get("nodeType") == "ComputeNode":
            entry.pop("publicIpAddress", None)   # compute nodes sit in the private subnet
        instances.append(entry)
    return {"instances": instances}


def describe_compute_fleet(args: argparse.Namespace) -> dict[str, Any]:
    current = _require_state(args.cluster_name)
    status = _fleet_status(current, _runtime_view(args.cluster_name))
    out: dict[str, Any] = {"status": status}
    if current.get("lastStatusUpdatedTime") and status != "UNKNOWN":
        out["lastStatusUpdatedTime"] = current["lastStatusUpdatedTime"]
    return out


def update_compute_fleet(args: argparse.Namespace) -> dict[str, Any]:
    name = args.cluster_name
    current = _require_state(name)
    if args.status not in ("START_REQUESTED", "STOP_REQUESTED"):
        raise Failure("Bad Request: the update compute fleet status can only be set to `START_REQUESTED` or "
                      "`STOP_REQUESTED` for Slurm scheduler clusters.")
    cluster_status = shapes.cluster_status_of(current["cloudFormationStackStatus"])
    if cluster_status not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        raise Failure(f"Bad Request: Cluster '{name}' is in {cluster_status}: its compute fleet cannot be "
                      "updated.")
    now = shapes.iso_now()
    with state.update_state(name) as latest:
        request_id = latest.get("fleetRequestId", 0) + 1
        latest.update(computeFleetStatus=args.status, fleetRequestPending=True, lastStatusUpdatedTime=now,
                      fleetRequestId=request_id)
        latest["fleetWorkerPid"] = spawn("fleet", state.cluster_dir(name), args.status, str(request_id))
    return {"status": args.status, "lastStatusUpdatedTime": now}


def cluster_logs_command(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return cluster_logs.run_command(args, _require_state(args.cluster_name), state.cluster_dir(args.cluster_name))
    except cluster_logs.LogsFailure as error:
        raise Failure(str(error)) from None


def version(_args: argparse.Namespace) -> dict[str, Any]:
    return {"version": shapes.PCLUSTER_VERSION}


# --- parser ----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pcluster", description="pcluster is the AWS ParallelCluster CLI (local UltraCluster edition).")
    subs = parser.add_subparsers(title="COMMANDS", dest="operation", required=True)

    def command(name: str, func: Callable[[argparse.Namespace], dict[str, Any]], text: str,
                region: bool = True) -> argparse.ArgumentParser:
        sub = subs.add_parser(name, help=text, description=text)
        sub.set_defaults(func=func)
        _add_common(sub, region)
        return sub

    create = command("create-cluster", create_cluster, "Create a managed cluster in a given region.")
    _add_name(create)
    create.add_argument("-c", "--cluster-configuration", required=True,
                        type=partial(_file_text, "cluster-configuration"))
    create.add_argument("--suppress-validators", nargs="+", type=partial(_matching, SUPPRESS_PATTERN,
                        "suppress-validators"))
    create.add_argument("--validation-failure-level", choices=("INFO", "WARNING", "ERROR"))
    # pcluster takes a value (`--dryrun true`); a bare `--dryrun` is accepted too.
    create.add_argument("--dryrun", nargs="?", const=True, default=False, type=partial(_boolean, "dryrun"))
    create.add_argument("--rollback-on-failure", type=partial(_boolean, "rollback-on-failure"))

    for name, func, text in (
        ("describe-cluster", describe_cluster, "Get detailed information about an existing cluster."),
        ("delete-cluster", delete_cluster, "Initiate the deletion of a cluster."),
        ("describe-compute-fleet", describe_compute_fleet, "Describe the status of the compute fleet."),
    ):
        _add_name(command(name, func, text))

    instances = command("describe-cluster-instances", describe_cluster_instances,
                        "Describe the instances belonging to a given cluster.")
    _add_name(instances)
    instances.add_argument("--next-token")
    instances.add_argument("--node-type", choices=("HeadNode", "ComputeNode", "LoginNode"))
    instances.add_argument("--queue-name")

    listing = command("list-clusters", list_clusters, "Retrieve the list of existing clusters.")
    listing.add_argument("--next-token")
    listing.add_argument("--cluster-status", nargs="+", choices=[s for s in shapes.CLUSTER_STATUSES
                                                                  if s != "DELETE_COMPLETE"])

    fleet = command("update-compute-fleet", update_compute_fleet, "Update the status of the cluster compute fleet.")
    _add_name(fleet)
    fleet.add_argument("--status", required=True, choices=FLEET_REQUESTS)

    cluster_logs.add_commands(command, _add_name, cluster_logs_command, partial(_boolean, "start-from-head"))
    images.add_commands(command, partial(_matching, images.IMAGE_ID_PATTERN, "imageId"),
                        partial(_file_text, "image-configuration"), partial(_matching, SUPPRESS_PATTERN,
                        "suppress-validators"), lambda name: partial(_boolean, name))
    command("version", version, "Displays the version of AWS ParallelCluster.", region=False)
    return parser


def run(argv: list[str]) -> dict[str, Any]:
    state.record_call(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.print_usage()
        print(f"Invalid arguments {extra}")
        sys.exit(1)
    if getattr(args, "region", None):
        os.environ["AWS_DEFAULT_REGION"] = args.region
    # moto accepts any credentials; without these botocore would stop with NoCredentialsError.
    for name, value in FAKE_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    result = args.func(args)
    return jmespath.search(args.query, result) if args.query else result


def main(argv: list[str] | None = None) -> None:
    try:
        result = run(sys.argv[1:] if argv is None else argv)
    except Failure as failure:
        print(json.dumps(failure.payload, indent=2))
        sys.exit(1)
    except validate.ConfigRejected as rejected:
        print(json.dumps(rejected.payload, indent=2))
        sys.exit(1)
    except NotLoopback as error:
        print(json.dumps({"message": str(error)}, indent=2))
        sys.exit(1)
    except (EndpointConnectionError, BotoCoreError) as error:
        print(json.dumps({"message": f"Unable to reach the AWS endpoint "
                                     f"({os.environ.get('AWS_ENDPOINT_URL', 'default')}): {error}"}, indent=2))
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(1)
    except Exception as error:  # noqa: BLE001 - pcluster turns every other error into this message
        print(json.dumps({"message": UNEXPECTED}, indent=2))
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
    if result is not None:
        print(json.dumps(result, indent=2))
    sys.exit(0)
