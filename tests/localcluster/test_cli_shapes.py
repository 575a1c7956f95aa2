"""The JSON of every pcluster command, field by field against recorded/ (real pcluster v3 shapes), through
the real `pcluster` binary, a real moto server and the detached workers."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.fixtures_localcluster import (
    REGION,
    UcNetwork,
    processes_mentioning,
    run_pcluster,
    wait_for_status,
    wait_until_gone,
)

pytestmark = pytest.mark.localcluster

RECORDED = Path(__file__).parent / "recorded"
ISO = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"
IPV4 = r"^\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}$"
PATTERNS = {
    "creationTime": ISO, "lastUpdatedTime": ISO, "launchTime": ISO, "lastStatusUpdatedTime": ISO,
    "cloudformationStackArn": r"^arn:aws:cloudformation:[a-z0-9-]+:\d{12}:stack/[A-Za-z][A-Za-z0-9-]*/[0-9a-f-]{36}$",
    "instanceId": r"^i-[0-9a-f]{8,17}$", "version": r"^3\.\d+\.\d+$", "url": r"^https?://\S+$",
    "privateIpAddress": IPV4, "publicIpAddress": IPV4, "region": r"^[a-z]{2}(-[a-z]+)+-\d$",
    "timestamp": ISO, "firstEventTimestamp": ISO, "lastEventTimestamp": ISO, "lastIngestionTime": ISO,
    "stackId": r"^arn:aws:cloudformation:[a-z0-9-]+:\d{12}:stack/[A-Za-z][A-Za-z0-9-]*/[0-9a-f-]{36}$",
    "logStreamName": r"^ip-\d+-\d+-\d+-\d+\.i-[0-9a-f]{8,17}\.[a-z-]+$",
}
STACK_STATUSES = {"CREATE_IN_PROGRESS", "CREATE_FAILED", "CREATE_COMPLETE", "ROLLBACK_IN_PROGRESS",
                  "ROLLBACK_FAILED", "ROLLBACK_COMPLETE", "DELETE_IN_PROGRESS", "DELETE_FAILED", "DELETE_COMPLETE",
                  "UPDATE_IN_PROGRESS", "UPDATE_COMPLETE", "UPDATE_FAILED"}
FLEET_STATUSES = {"START_REQUESTED", "STARTING", "RUNNING", "PROTECTED", "STOP_REQUESTED", "STOPPING", "STOPPED",
                  "UNKNOWN"}
ENUMS = {
    "clusterStatus": {"CREATE_IN_PROGRESS", "CREATE_FAILED", "CREATE_COMPLETE", "DELETE_IN_PROGRESS",
                      "DELETE_FAILED", "DELETE_COMPLETE", "UPDATE_IN_PROGRESS", "UPDATE_COMPLETE", "UPDATE_FAILED"},
    "cloudFormationStackStatus": STACK_STATUSES, "cloudformationStackStatus": STACK_STATUSES,
    "computeFleetStatus": FLEET_STATUSES, "status": FLEET_STATUSES,
    "state": {"pending", "running", "shutting-down", "terminated", "stopping", "stopped"},
    "nodeType": {"HeadNode", "ComputeNode", "LoginNode"},
    "resourceStatus": {f"{verb}_{state}" for verb in ("CREATE", "DELETE", "UPDATE", "ROLLBACK", "IMPORT")
                       for state in ("IN_PROGRESS", "COMPLETE", "FAILED")},
}


def recorded(name: str) -> Any:
    return json.loads((RECORDED / f"{name}.json").read_text())


def assert_same_shape(actual: Any, reference: Any, path: str = "$") -> None:
    """Same keys and types as the reference; varying values checked by pattern or enum."""
    if isinstance(reference, dict):
        assert isinstance(actual, dict), f"{path}: {actual!r} is not an object"
        assert set(actual) == set(reference), f"{path}: keys {sorted(actual)} != {sorted(reference)}"
        for key, ref_value in reference.items():
            value, where = actual[key], f"{path}.{key}"
            if key in PATTERNS:
                assert isinstance(value, str) and re.match(PATTERNS[key], value), f"{where}: {value!r}"
            elif key in ENUMS:
                assert value in ENUMS[key], f"{where}: {value!r}"
            else:
                assert_same_shape(value, ref_value, where)
    elif isinstance(reference, list):
        assert isinstance(actual, list), f"{path}: {actual!r} is not a list"
        for index, item in enumerate(actual):
            same_kind = [r for r in reference if not isinstance(r, dict) or r.get("nodeType") == item.get("nodeType")]
            assert same_kind, f"{path}[{index}]: nothing like {item!r} in the reference"
            # Optional keys (a stack event's resourceStatusReason): compare with a reference item that has them.
            same_keys = [r for r in same_kind if isinstance(r, dict) and set(r) == set(item)]
            assert_same_shape(item, (same_keys or same_kind)[0], f"{path}[{index}]")
    else:
        assert type(actual) is type(reference), f"{path}: {actual!r} vs reference {reference!r}"


def aws_client(env: dict[str, str], service: str) -> Any:
    return boto3.client(service, region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"],
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def stack_gone(env: dict[str, str], name: str) -> bool:
    try:
        stacks = aws_client(env, "cloudformation").describe_stacks(StackName=name)["Stacks"]
    except ClientError as error:
        return "does not exist" in str(error)
    return all(s["StackStatus"] == "DELETE_COMPLETE" for s in stacks)


def delete_and_wait(env: dict[str, str], home: Path, name: str) -> None:
    code, out = run_pcluster(env, "delete-cluster", "-n", name)
    assert code == 0, out
    assert_same_shape(out, recorded("delete_cluster"))
    assert out["cluster"]["clusterStatus"] == "DELETE_IN_PROGRESS"
    gone = wait_until_gone(env, name)
    assert gone == {"message": f"Cluster '{name}' does not exist or belongs to an incompatible ParallelCluster "
                               "major version."}
    assert not (home / "clusters" / name).exists()
    assert stack_gone(env, name)
    assert processes_after_exit(str(home / "clusters" / name)) == []


def processes_after_exit(text: str, timeout: float = 30) -> list[str]:
    """Processes mentioning text once workers had time to exit (they exit right after writing state)."""
    deadline = time.monotonic() + timeout
    while processes_mentioning(text) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_mentioning(text)


def test_version(pcluster: Callable[..., tuple[int, Any]]) -> None:
    assert pcluster("version") == (0, recorded("version"))


def test_in_progress_shapes_then_delete_then_not_found(
        pcluster: Callable[..., tuple[int, Any]], make_cluster_config: Callable[..., Path],
        uc_env: dict[str, str], uc_home: Path, uc_network: UcNetwork) -> None:
    # Stays CREATE_IN_PROGRESS for the whole test: a long provisioning delay.
    config = make_cluster_config(tags={"local-ultracluster:provisioning-delay": "600", "project": "ultracluster"})
    code, created = pcluster("create-cluster", "-n", "shapes", "-c", str(config))
    assert code == 0, created
    assert_same_shape(created, recorded("create_cluster"))
    assert created["cluster"]["cloudformationStackStatus"] == "CREATE_IN_PROGRESS"
    assert created["cluster"]["clusterName"] == "shapes"

    code, described = pcluster("describe-cluster", "-n", "shapes")
    assert code == 0
    assert_same_shape(described, recorded("describe_cluster_in_progress"))
    assert (described["clusterStatus"], described["cloudFormationStackStatus"]) == ("CREATE_IN_PROGRESS",) * 2
    assert described["cloudformationStackArn"] == created["cluster"]["cloudformationStackArn"]
    assert {"key": "project", "value": "ultracluster"} in described["tags"]
    assert {"key": "parallelcluster:cluster-name", "value": "shapes"} in described["tags"]
    # The presigned URL serves the uploaded config from moto's S3.
    with urllib.request.urlopen(described["clusterConfiguration"]["url"], timeout=10) as response:
        assert response.read().decode() == config.read_text()

    code, listed = pcluster("list-clusters")
    assert code == 0
    assert_same_shape(listed, recorded("list_clusters"))
    assert [c["clusterName"] for c in listed["clusters"]] == ["shapes"]
    code, filtered = pcluster("list-clusters", "--cluster-status", "CREATE_COMPLETE")
    assert (code, filtered) == (0, {"clusters": []})

    assert pcluster("describe-compute-fleet", "-n", "shapes") == (0, {"status": "UNKNOWN"})
    assert pcluster("describe-cluster-instances", "-n", "shapes") == (0, {"instances": []})
    # Every CLI call is kept, with its cluster, in the home's ledger of calls (bench/pipeline.py counts them).
    calls = [json.loads(line) for line in (uc_home / "logs" / "pcluster-calls.jsonl").read_text().splitlines()]
    mine = [(c["command"], c["cluster"]) for c in calls if c["cluster"] in ("shapes", None)]
    assert mine[-6:] == [("create-cluster", "shapes"), ("describe-cluster", "shapes"), ("list-clusters", None),
                         ("list-clusters", None), ("describe-compute-fleet", "shapes"),
                         ("describe-cluster-instances", "shapes")], mine

    # The stack in moto carries pcluster's tags and holds the head node security group in the config's VPC.
    stack = aws_client(uc_env, "cloudformation").describe_stacks(StackName="shapes")["Stacks"][0]
    tags = {t["Key"]: t["Value"] for t in stack["Tags"]}
    assert tags == {"parallelcluster:version": described["version"], "parallelcluster:cluster-name": "shapes",
                    "local-ultracluster:provisioning-delay": "600", "project": "ultracluster"}
    resources = aws_client(uc_env, "cloudformation").describe_stack_resources(StackName="shapes")["StackResources"]
    [group] = [r for r in resources if r["ResourceType"] == "AWS::EC2::SecurityGroup"]
    sg = aws_client(uc_env, "ec2").describe_security_groups(GroupIds=[group["PhysicalResourceId"]])
    assert sg["SecurityGroups"][0]["VpcId"] == uc_network.vpc_id

    delete_and_wait(uc_env, uc_home, "shapes")
    with pytest.raises(ClientError):
        aws_client(uc_env, "ec2").describe_security_groups(GroupIds=[group["PhysicalResourceId"]])
    assert pcluster("delete-cluster", "-n", "shapes") == (1, recorded("error_delete_cluster_not_found") | {
        "message": recorded("error_delete_cluster_not_found")["message"].replace("'nothere'", "'shapes'")})
    assert pcluster("describe-compute-fleet", "-n", "shapes") == (1, {
        "message": recorded("error_describe_compute_fleet_not_found")["message"].replace("'nothere'", "'shapes'")})
    assert pcluster("describe-cluster-instances", "-n", "shapes") == (
        0, recorded("describe_cluster_instances_not_found"))
    assert pcluster("list-clusters") == (0, {"clusters": []})


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_the_stack_holds_the_clusters_log_group(policy: str, pcluster: Callable[..., tuple[int, Any]],
                                                make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                                                uc_home: Path) -> None:
    """As pcluster's cluster stack: /aws/parallelcluster/<name>-<yyyymmddHHMM>, the config's retention,
    and its DeletionPolicy (Retain by default: the group outlives the cluster, and a new cluster of the
    same name in the same minute is refused for it)."""
    name = f"logs-{policy.lower()}"

    def logging(config: dict[str, Any]) -> None:
        cloud_watch = config["Monitoring"]["Logs"]["CloudWatch"]
        cloud_watch["RetentionInDays"] = 14
        if policy == "Retain":
            cloud_watch.pop("DeletionPolicy")   # the default

    config = make_cluster_config(logging, tags={"local-ultracluster:provisioning-delay": "600"})
    assert pcluster("create-cluster", "-n", name, "-c", str(config))[0] == 0
    resources = aws_client(uc_env, "cloudformation").describe_stack_resources(StackName=name)["StackResources"]
    [group] = [r["PhysicalResourceId"] for r in resources if r["ResourceType"] == "AWS::Logs::LogGroup"]
    assert re.fullmatch(rf"/aws/parallelcluster/{name}-\d{{12}}", group), group
    logs = aws_client(uc_env, "logs")
    [described] = logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"]
    assert described["retentionInDays"] == 14
    delete_and_wait(uc_env, uc_home, name)
    kept = logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"]
    assert len(kept) == (1 if policy == "Retain" else 0)
    if policy == "Retain":
        # Whatever minute the next create falls in, a kept group of that name is there already.
        now = datetime.now(timezone.utc)
        taken = {f"/aws/parallelcluster/{name}-{(now + timedelta(minutes=m)).strftime('%Y%m%d%H%M')}" for m in (0, 1)}
        for other in taken - {group}:
            logs.create_log_group(logGroupName=other)
        code, out = pcluster("create-cluster", "-n", name, "-c", str(config))
        assert code == 1 and re.match(rf"Bad Request: CloudWatch log group ({'|'.join(map(re.escape, taken))}) "
                                      "already exists", out["message"]), out
        for kept_group in taken | {group}:
            logs.delete_log_group(logGroupName=kept_group)


def test_not_found_messages_match_pcluster(pcluster: Callable[..., tuple[int, Any]]) -> None:
    assert pcluster("describe-cluster", "-n", "nothere") == (1, recorded("error_describe_cluster_not_found"))
    assert pcluster("delete-cluster", "-n", "nothere") == (1, recorded("error_delete_cluster_not_found"))
    assert pcluster("describe-compute-fleet", "-n", "nothere") == (
        1, recorded("error_describe_compute_fleet_not_found"))
    assert pcluster("describe-cluster-instances", "-n", "nothere") == (
        0, recorded("describe_cluster_instances_not_found"))


@pytest.mark.parametrize(("rollback", "stack_status"), [(None, "ROLLBACK_COMPLETE"), ("false", "CREATE_FAILED")])
def test_fail_create_fault_after_a_provisioning_window(
        rollback: str | None, stack_status: str, pcluster: Callable[..., tuple[int, Any]],
        make_cluster_config: Callable[..., Path], uc_env: dict[str, str], uc_home: Path) -> None:
    config = make_cluster_config(tags={"local-ultracluster:provisioning-delay": "5",
                                       "local-ultracluster:fail-create": "OnNodeConfiguredExecutionFailure"})
    extra = ["--rollback-on-failure", rollback] if rollback else []
    code, created = pcluster("create-cluster", "-n", "doomed", "-c", str(config), *extra)
    assert code == 0, created
    # The window: CREATE_IN_PROGRESS while the create worker waits. The worker is paused so a slow
    # machine cannot close the window before we look.
    worker = json.loads((uc_home / "clusters" / "doomed" / "cluster.json").read_text())["createWorkerPid"]
    os.kill(worker, signal.SIGSTOP)
    try:
        assert processes_mentioning(f"localcluster.worker create {uc_home}/clusters/doomed")
        code, early = pcluster("describe-cluster", "-n", "doomed")
        assert early["clusterStatus"] == "CREATE_IN_PROGRESS", early
        assert "failures" not in early
    finally:
        os.kill(worker, signal.SIGCONT)

    failed = wait_for_status(uc_env, "doomed", {"CREATE_FAILED", "CREATE_COMPLETE"})
    assert_same_shape(failed, recorded("describe_cluster_failed"))
    assert failed["clusterStatus"] == "CREATE_FAILED"
    assert failed["cloudFormationStackStatus"] == stack_status
    assert failed["failures"] == recorded("describe_cluster_failed")["failures"]
    # No daemons were left: nothing provisioned, no process runs for the cluster.
    assert not (uc_home / "clusters" / "doomed" / "runtime.json").exists()
    assert processes_mentioning(str(uc_home / "clusters" / "doomed")) == []
    assert_failure_records(pcluster, uc_home, "doomed", rollback=stack_status == "ROLLBACK_COMPLETE")
    code, listed = pcluster("list-clusters", "--cluster-status", "CREATE_FAILED")
    assert [c["clusterName"] for c in listed["clusters"]] == ["doomed"]
    assert pcluster("update-compute-fleet", "-n", "doomed", "--status", "STOP_REQUESTED")[0] == 1
    delete_and_wait(uc_env, uc_home, "doomed")


def assert_failure_records(pcluster: Callable[..., tuple[int, Any]], home: Path, name: str, rollback: bool) -> None:
    """get-cluster-stack-events, list-cluster-log-streams and get-cluster-log-events of a failed create."""
    code, events = pcluster("get-cluster-stack-events", "-n", name)
    assert code == 0, events
    assert_same_shape(events, recorded("get_cluster_stack_events"))
    statuses = [(e["logicalResourceId"], e["resourceStatus"]) for e in events["events"]]   # newest first
    assert statuses[-1] == (name, "CREATE_IN_PROGRESS") and statuses[0] == (
        name, "ROLLBACK_COMPLETE" if rollback else "CREATE_FAILED")
    [wait] = [e for e in events["events"] if e["resourceStatus"] == "CREATE_FAILED" and e["logicalResourceId"] != name]
    assert wait["logicalResourceId"].startswith("HeadNodeWaitCondition")
    assert wait["resourceStatusReason"].startswith(
        "WaitCondition received failed message: 'Failed to execute OnNodeConfigured script.")

    code, streams = pcluster("list-cluster-log-streams", "-n", name, "--filters", "Name=node-type,Values=HeadNode")
    assert code == 0, streams
    assert_same_shape(streams, recorded("list_cluster_log_streams"))
    names = [s["logStreamName"] for s in streams["logStreams"]]
    assert [n.rsplit(".", 1)[1] for n in names] == ["cfn-init", "chef-client"]
    host = names[0].split(".")[0]
    assert pcluster("list-cluster-log-streams", "-n", name, "--filters", f"Name=private-dns-name,Values={host}")[1] \
        == streams
    assert pcluster("list-cluster-log-streams", "-n", name, "--filters", "Name=private-dns-name,Values=ip-1-2-3-4") \
        == (0, {"logStreams": []})
    assert pcluster("list-cluster-log-streams", "-n", name, "--filters", "Name=color,Values=red")[0] == 1

    # The tail is the last lines of the head node's real log file, in time order.
    code, tail = pcluster("get-cluster-log-events", "-n", name, "--log-stream-name", names[0], "--limit", "3",
                          "--start-from-head", "false")
    assert code == 0, tail
    assert_same_shape(tail, recorded("get_cluster_log_events"))
    on_disk = (home / "clusters" / name / "cloudwatch" / "streams" / names[0]).read_text().splitlines()
    assert [e["message"] for e in tail["events"]] == on_disk[-3:]
    assert "Command runpostinstall" in on_disk[-4]
    code, head = pcluster("get-cluster-log-events", "-n", name, "--log-stream-name", names[0], "--limit", "2",
                          "--start-from-head", "true")
    assert [e["message"] for e in head["events"]] == on_disk[:2]
    assert pcluster("get-cluster-log-events", "-n", name, "--log-stream-name", "nope") == (
        1, {"message": "The specified log stream nope does not exist."})


def test_delete_during_create_in_progress(pcluster: Callable[..., tuple[int, Any]],
                                          make_cluster_config: Callable[..., Path],
                                          uc_env: dict[str, str], uc_home: Path) -> None:
    config = make_cluster_config(tags={"local-ultracluster:provisioning-delay": "600"})
    code, _ = pcluster("create-cluster", "-n", "shortlived", "-c", str(config))
    assert code == 0
    create_pid = json.loads((uc_home / "clusters" / "shortlived" / "cluster.json").read_text())["createWorkerPid"]
    delete_and_wait(uc_env, uc_home, "shortlived")
    assert not Path(f"/proc/{create_pid}").exists() or "Z" in Path(f"/proc/{create_pid}/stat").read_text()


def test_cli_argument_errors_like_pcluster(pcluster: Callable[..., tuple[int, Any]], uc_env: dict[str, str]) -> None:
    import subprocess

    from tests.fixtures_localcluster import PCLUSTER_BIN
    missing = subprocess.run([str(PCLUSTER_BIN), "describe-cluster"], env=uc_env, capture_output=True, text=True)
    assert missing.returncode == 2 and "-n/--cluster-name" in missing.stderr
    bad_choice = subprocess.run([str(PCLUSTER_BIN), "update-compute-fleet", "-n", "xy", "--status", "FOO"],
                                env=uc_env, capture_output=True, text=True)
    assert bad_choice.returncode == 2 and "invalid choice" in bad_choice.stderr
    assert pcluster("update-compute-fleet", "-n", "nothere", "--status", "ENABLED") == (1, {
        "message": "Cluster 'nothere' does not exist or belongs to an incompatible ParallelCluster major version."})
    assert pcluster("version", "--query", "version") == (0, recorded("version")["version"])


RUNTIME_READY = os.geteuid() == 0 and bool(shutil.which("slurmctld")) and bool(shutil.which("sshd") or
                                                                               Path("/usr/sbin/sshd").exists())


@pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd for real daemons")
def test_full_lifecycle_create_complete_fleet_delete(
        pcluster: Callable[..., tuple[int, Any]], make_cluster_config: Callable[..., Path],
        uc_env: dict[str, str], uc_home: Path) -> None:
    config = make_cluster_config(static=1, dynamic=1, tags={"local-ultracluster:provisioning-delay": "1"})
    code, created = pcluster("create-cluster", "-n", "lifecycle", "-c", str(config))
    assert code == 0, created
    complete = wait_for_status(uc_env, "lifecycle", {"CREATE_COMPLETE", "CREATE_FAILED"}, timeout=240)
    assert complete["clusterStatus"] == "CREATE_COMPLETE", (
        complete, (uc_home / "clusters" / "lifecycle" / "worker-create.log").read_text()[-3000:])
    assert_same_shape(complete, recorded("describe_cluster_complete"))
    assert complete["computeFleetStatus"] == "RUNNING"
    head = complete["headNode"]
    assert head["state"] == "running" and head["privateIpAddress"].startswith("127.100.")

    code, events = pcluster("get-cluster-stack-events", "-n", "lifecycle")
    assert_same_shape(events, recorded("get_cluster_stack_events"))
    assert (events["events"][0]["resourceStatus"], events["events"][-1]["resourceStatus"]) == (
        "CREATE_COMPLETE", "CREATE_IN_PROGRESS")
    code, streams = pcluster("list-cluster-log-streams", "-n", "lifecycle", "--filters", "Name=node-type,Values=HeadNode")
    assert [s["logStreamName"] for s in streams["logStreams"]] == [
        f"ip-{head['privateIpAddress'].replace('.', '-')}.{head['instanceId']}.{log}"
        for log in ("cfn-init", "chef-client", "clustermgtd")]

    code, instances = pcluster("describe-cluster-instances", "-n", "lifecycle")
    assert code == 0
    assert_same_shape(instances, recorded("describe_cluster_instances"))
    kinds = sorted(i["nodeType"] for i in instances["instances"])
    assert kinds == ["ComputeNode", "HeadNode"]   # the static node; the dynamic one is powered down
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=uc_env["AWS_ENDPOINT_URL"],
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    tagged = [{"Name": "tag:parallelcluster:cluster-name", "Values": ["lifecycle"]}]

    def ec2_states() -> dict[str, str]:
        return {i["InstanceId"]: i["State"]["Name"]
                for r in ec2.describe_instances(Filters=tagged)["Reservations"] for i in r["Instances"]}
    # Each node pcluster describes is an EC2 instance of the cluster, with its launch time.
    assert {i["instanceId"]: "running" for i in instances["instances"]}.items() <= ec2_states().items()
    code, only_compute = pcluster("describe-cluster-instances", "-n", "lifecycle", "--node-type", "ComputeNode",
                                  "--queue-name", "compute1")
    assert [i["nodeType"] for i in only_compute["instances"]] == ["ComputeNode"]
    assert pcluster("describe-cluster-instances", "-n", "lifecycle", "--queue-name", "nope") == (0, {"instances": []})

    code, fleet = pcluster("describe-compute-fleet", "-n", "lifecycle")
    assert code == 0
    assert_same_shape(fleet, recorded("describe_compute_fleet"))
    assert fleet["status"] == "RUNNING"

    code, stop = pcluster("update-compute-fleet", "-n", "lifecycle", "--status", "STOP_REQUESTED")
    assert code == 0
    assert_same_shape(stop, recorded("update_compute_fleet"))
    assert stop["status"] == "STOP_REQUESTED"
    wait_for_fleet(uc_env, "lifecycle", "STOPPED")
    code, start = pcluster("update-compute-fleet", "-n", "lifecycle", "--status", "START_REQUESTED")
    assert (code, start["status"]) == (0, "START_REQUESTED")
    wait_for_fleet(uc_env, "lifecycle", "RUNNING")
    # Back to back: the START waits for the STOP; the last request wins.
    assert pcluster("update-compute-fleet", "-n", "lifecycle", "--status", "STOP_REQUESTED")[0] == 0
    assert pcluster("update-compute-fleet", "-n", "lifecycle", "--status", "START_REQUESTED")[0] == 0
    wait_for_fleet(uc_env, "lifecycle", "RUNNING")
    assert processes_after_exit("localcluster.worker fleet " + str(uc_home)) == []

    delete_and_wait(uc_env, uc_home, "lifecycle")
    assert not (uc_home / "slots").exists() or not list((uc_home / "slots").glob("*.json"))
    assert set(ec2_states().values()) == {"terminated"}   # what the delete ended, EC2 still lists
    # The ledger keeps what was alive when, with the cluster's tags, after the cluster is gone.
    ledger = [json.loads(line) for line in (uc_home / "logs" / "clusters.jsonl").read_text().splitlines()]
    mine = [e for e in ledger if e["cluster"] == "lifecycle"]
    assert [e["event"] for e in mine] == ["created", "deleted"] and mine[0]["time"] < mine[1]["time"]
    assert mine[0]["tags"]["parallelcluster:cluster-name"] == mine[1]["tags"]["parallelcluster:cluster-name"] == "lifecycle"


def wait_for_fleet(env: dict[str, str], name: str, wanted: str, timeout: float = 120) -> None:
    """Poll describe-compute-fleet; on timeout the fleet worker's log says why."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        code, last = run_pcluster(env, "describe-compute-fleet", "-n", name)
        if code == 0 and last["status"] == wanted:
            return
        time.sleep(0.5)
    log = Path(env["LOCAL_ULTRACLUSTER_HOME"]) / "clusters" / name / "worker-fleet.log"
    tail = log.read_text()[-4000:] if log.exists() else "(no worker log)"
    raise AssertionError(f"fleet of {name} never reached {wanted}: {last}\n{tail}")


def test_spec_handed_to_the_runtime(pcluster: Callable[..., tuple[int, Any]],
                                    make_cluster_config: Callable[..., Path],
                                    uc_env: dict[str, str], uc_home: Path) -> None:
    """spec.json: queues, counts, EFA, mount dirs, accounting, caller tags, and faults from tags and env."""
    config = make_cluster_config(static=2, dynamic=3, queues=2, accounting=True, tags={
        "local-ultracluster:provisioning-delay": "600", "local-ultracluster:insufficient-capacity": "trn1",
        "local-ultracluster:ssh-outage": "5:10", "local-ultracluster:insufficient-capacity-timeout": "30",
        "team": "ml"})
    env = {**uc_env, "LOCAL_UC_KILL_NODE_AFTER": "7", "LOCAL_UC_PROVISIONING_DELAY": "1"}
    code, out = run_pcluster(env, "create-cluster", "-n", "specced", "-c", str(config))
    assert code == 0, out
    spec = json.loads((uc_home / "clusters" / "specced" / "spec.json").read_text())
    assert spec["name"] == "specced" and spec["region"] == REGION and spec["key_name"] == "ultracluster-local"
    assert spec["head_instance_type"] == "c5.4xlarge"
    assert [q["name"] for q in spec["queues"]] == ["compute1", "compute2"]
    assert spec["queues"][0]["placement_group"] is True and spec["queues"][0]["capacity_type"] == "ONDEMAND"
    assert spec["queues"][0]["compute_resources"] == [
        {"name": "trn1", "instance_type": "trn1.32xlarge", "min_count": 2, "max_count": 5, "efa": True}]
    assert spec["mount_dirs"] == ["/fsx"] and spec["accounting"] is True
    assert spec["scaledown_idletime_min"] == 10.0
    assert ["team", "ml"] in spec["tags"]
    # The tag wins over the variable; variables fill in what tags do not set.
    assert spec["faults"] == {"provisioning_delay": 600.0, "fail_create": None, "insufficient_capacity": ["trn1"],
                              "insufficient_capacity_timeout": 30.0, "kill_node_after": 7.0, "ssh_outage": [5.0, 10.0], "boot_delay": 2.0,
                              "neuron_unhealthy": [], "efa_unhealthy": []}
    assert spec["config_yaml"] == config.read_text()
    delete_and_wait(uc_env, uc_home, "specced")


def test_fail_create_from_the_environment(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                                          uc_home: Path) -> None:
    env = {**uc_env, "LOCAL_UC_FAIL_CREATE": "FsxMountFailure"}
    code, _ = run_pcluster(env, "create-cluster", "-n", "envfail", "-c", str(make_cluster_config()))
    assert code == 0
    failed = wait_for_status(uc_env, "envfail", {"CREATE_FAILED", "CREATE_COMPLETE"})
    assert failed["failures"] == [{"failureCode": "FsxMountFailure", "failureReason": "Failed to mount FSX."}]
    delete_and_wait(uc_env, uc_home, "envfail")


def test_an_endpoint_off_loopback_is_refused(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                                             uc_home: Path) -> None:
    env = {**uc_env, "AWS_ENDPOINT_URL": "http://192.0.2.1:5055"}   # checked before any connection is made
    code, out = run_pcluster(env, "create-cluster", "-n", "offsite", "-c", str(make_cluster_config()))
    assert code == 1 and "not a loopback address" in out["message"]
    assert not (uc_home / "clusters" / "offsite").exists()


def test_a_cluster_exists_only_in_its_region(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                                            uc_home: Path) -> None:
    config = make_cluster_config(tags={"local-ultracluster:provisioning-delay": "600"})
    assert run_pcluster(uc_env, "create-cluster", "-n", "regional", "-c", str(config))[0] == 0
    elsewhere = ("-r", "us-west-2")
    assert run_pcluster(uc_env, "describe-cluster", "-n", "regional", *elsewhere)[0] == 1
    assert run_pcluster(uc_env, "list-clusters", *elsewhere) == (0, {"clusters": []})
    assert run_pcluster(uc_env, "delete-cluster", "-n", "regional", *elsewhere)[0] == 1
    assert run_pcluster(uc_env, "describe-cluster", "-n", "regional", "-r", REGION)[0] == 0
    delete_and_wait(uc_env, uc_home, "regional")


def test_a_dead_create_worker_fails_the_cluster_like_a_timeout(
        make_cluster_config: Callable[..., Path], uc_env: dict[str, str], uc_home: Path) -> None:
    config = make_cluster_config(tags={"local-ultracluster:provisioning-delay": "600"})
    assert run_pcluster(uc_env, "create-cluster", "-n", "killed", "-c", str(config))[0] == 0
    worker = json.loads((uc_home / "clusters" / "killed" / "cluster.json").read_text())["createWorkerPid"]
    os.kill(worker, signal.SIGKILL)
    assert processes_after_exit(f"localcluster.worker create {uc_home}/clusters/killed") == []
    failed = wait_for_status(uc_env, "killed", {"CREATE_FAILED"})
    assert failed["failures"] == [{"failureCode": "HeadNodeBootstrapFailure",
                                   "failureReason": "Cluster creation timed out."}]
    delete_and_wait(uc_env, uc_home, "killed")
