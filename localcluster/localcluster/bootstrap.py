"""What a head node's bootstrap leaves behind: stack events and its cfn-init / chef-client logs.

The create worker calls ``completed`` or ``failed`` before it writes the status they explain, so a
caller that sees CREATE_FAILED already finds the events and the log tail (cluster_logs serves them).
The head node is the provisioned one (runtime.json); a ``fail-create`` fault, which provisions
nothing, launches a head node instance in moto as pcluster does before the bootstrap fails (with
rollback, the rollback terminates it again).
"""
from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from . import cluster_logs as cw
from .shapes import failure_for
from .spec import ClusterSpec

LOG = logging.getLogger("localcluster.bootstrap")
STACK = "AWS::CloudFormation::Stack"
LOGS_HINT = ("Please check /var/log/chef-client.log in the head node, or check the chef-client.log in CloudWatch "
             "logs. Please refer to https://docs.aws.amazon.com/parallelcluster/latest/ug/troubleshooting-v3.html"
             "#troubleshooting-v3-get-logs for more details on ParallelCluster logs.")
# cfn-init's commands, in order; a custom action failure stops at its own.
_COMMANDS = (("shellRunPreInstall", "runpreinstall", "/opt/parallelcluster/scripts/fetch_and_run -preinstall"),
             ("chefConfig", "chef", "cinc-client --local-mode --config /etc/chef/client.rb"),
             ("shellRunPostInstall", "runpostinstall", "/opt/parallelcluster/scripts/fetch_and_run -postinstall"))


def _head(cluster_dir: Path) -> tuple[str, str] | None:
    runtime = Path(cluster_dir) / "runtime.json"
    try:
        head = json.loads(runtime.read_text())["head_node"]
        return (head["hostname"], head["instance_id"]) if head.get("instance_id") else None
    except (OSError, ValueError, KeyError):
        return None


def _launch_head(spec: ClusterSpec) -> tuple[str, str] | None:
    from .aws import Aws
    try:
        aws = Aws(spec.region)
        instance_id, _ = aws.run_instance(spec.name, "HeadNode", spec.head_instance_type, "HeadNode")
        described = aws.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        return "ip-" + described["PrivateIpAddress"].replace(".", "-"), instance_id
    except Exception as error:   # no head node: the failure still gets its stack events
        LOG.warning("could not launch a head node instance for the failed bootstrap: %r", error)
        return None


def _failing_command(code: str) -> str:
    if code.startswith("OnNodeStart"):
        return "runpreinstall"
    return "runpostinstall" if code.startswith("OnNodeConfigured") else "chef"


def _cfn_init(failing: str | None, reason: str) -> list[str]:
    lines = [cw.cfn_line("INFO", "-----------------------Starting build-----------------------"),
             cw.cfn_line("INFO", "Running configSets: default"), cw.cfn_line("INFO", "Running configSet default"),
             cw.cfn_line("INFO", "Running config deployConfigFiles")]
    for config, command, argv in _COMMANDS:
        lines += [cw.cfn_line("INFO", f"Running config {config}"), cw.cfn_line("INFO", f"Running command {command}")]
        if command == failing:
            return lines + [cw.cfn_line("ERROR", f"Command {command} ({argv}) failed"),
                            cw.cfn_line("ERROR", reason),
                            cw.cfn_line("ERROR", f"Error encountered during build of {config}: Command {command} failed"),
                            cw.cfn_line("INFO", "-----------------------Build complete-----------------------")]
        lines.append(cw.cfn_line("INFO", f"Command {command} succeeded"))
    return lines + [cw.cfn_line("INFO", "ConfigSets completed"),
                    cw.cfn_line("INFO", "-----------------------Build complete-----------------------")]


def _chef_client(spec: ClusterSpec, failing: str | None, reason: str, detail: str | None) -> list[str]:
    lines = [cw.chef_line("INFO", "Started Cinc Zero at chefzero://localhost:1 with repository at /etc/chef"),
             cw.chef_line("INFO", "Cinc Client, version 18.4.12"),
             cw.chef_line("INFO", "Run List is [recipe[aws-parallelcluster-entrypoints::init], "
                                  "recipe[aws-parallelcluster-entrypoints::config]]")]
    lines += [cw.chef_line("INFO", f"Processing directory[{d}] action create") for d in spec.mount_dirs]
    lines.append(cw.chef_line("INFO", "Processing service[slurmctld] action enable"))
    if failing == "chef":
        for text in (detail or reason).splitlines()[-30:]:
            lines.append(cw.chef_line("ERROR", text))
        return lines + [cw.chef_line("FATAL", "Chef::Exceptions::ChildConvergeError: Chef run process exited "
                                              "unsuccessfully (exit code 1)")]
    return lines + [cw.chef_line("INFO", "Cinc Client Run complete"),
                    cw.chef_line("INFO", "Cinc Client finished, 312/489 resources updated")]


def _write_logs(cluster_dir: Path, spec: ClusterSpec, head: tuple[str, str], failing: str | None, reason: str,
                detail: str | None = None) -> None:
    hostname, instance_id = head
    cw.remember_head(cluster_dir, hostname, instance_id)
    cw.write_log(cluster_dir, hostname, instance_id, cw.CFN_INIT, _cfn_init(failing, reason))
    cw.write_log(cluster_dir, hostname, instance_id, cw.CHEF_CLIENT, _chef_client(spec, failing, reason, detail))


def _wait_condition() -> str:
    return "HeadNodeWaitCondition" + datetime.now(UTC).strftime("%Y%m%d%H%M%S")


def completed(cluster_dir: Path, spec: ClusterSpec) -> None:
    head = _head(cluster_dir)
    if head:
        _write_logs(cluster_dir, spec, head, None, "")
        cw.stack_event(cluster_dir, "HeadNode", "AWS::EC2::Instance", "CREATE_COMPLETE", physical_id=head[1])
    cw.stack_event(cluster_dir, _wait_condition(), "AWS::CloudFormation::WaitCondition", "CREATE_COMPLETE")
    cw.stack_event(cluster_dir, spec.name, STACK, "CREATE_COMPLETE")


def failed(cluster_dir: Path, spec: ClusterSpec, code: str, rollback: bool, detail: str | None = None) -> None:
    """Events and logs of a bootstrap that failed with pcluster failure ``code``; best effort, never raises."""
    try:
        _failed(cluster_dir, spec, code, rollback, detail)
    except Exception:
        LOG.exception("could not record the failed bootstrap of %s", spec.name)


def _failed(cluster_dir: Path, spec: ClusterSpec, code: str, rollback: bool, detail: str | None) -> None:
    wait = _wait_condition()
    head = _head(cluster_dir) or _launch_head(spec)
    if head:
        message = f"{failure_for(code)['failureReason']} {LOGS_HINT}"
        _write_logs(cluster_dir, spec, head, _failing_command(code), message, detail)
        cw.stack_event(cluster_dir, "HeadNode", "AWS::EC2::Instance", "CREATE_COMPLETE", physical_id=head[1])
        reason = f"WaitCondition received failed message: '{message}' for uniqueId: {head[1]}"
    else:
        reason = "WaitCondition timed out. Received 0 conditions when expecting 1"
    cw.stack_event(cluster_dir, wait, "AWS::CloudFormation::WaitCondition", "CREATE_FAILED", reason)
    summary = f"The following resource(s) failed to create: [{wait}]. "
    if not rollback:
        cw.stack_event(cluster_dir, spec.name, STACK, "CREATE_FAILED", summary)
        return
    cw.stack_event(cluster_dir, spec.name, STACK, "ROLLBACK_IN_PROGRESS", summary + "Rollback requested by user.")
    if head:
        from .aws import Aws
        try:
            Aws(spec.region).terminate_instances([head[1]])
        except Exception as error:
            LOG.warning("rollback could not terminate %s: %r", head[1], error)
        cw.stack_event(cluster_dir, "HeadNode", "AWS::EC2::Instance", "DELETE_COMPLETE", physical_id=head[1])
    cw.stack_event(cluster_dir, spec.name, STACK, "ROLLBACK_COMPLETE")
