"""Stack events and head node logs: get-cluster-stack-events, list-cluster-log-streams, get-cluster-log-events.

pcluster reads them from CloudFormation and CloudWatch Logs; here they are the cluster's own records,
written by the CLI and the create worker before the status they explain becomes visible:

<cluster dir>/cloudwatch/stack-events.jsonl   one CloudFormation event per line, oldest first
<cluster dir>/cloudwatch/streams/<stream>      one real log file per stream, named as pcluster names
                                              them: <short private DNS name>.<instance id>.<log>

Shapes follow aws-parallelcluster 3.16.1 (api/controllers/cluster_logs_controller.py, api/models
StackEvent, LogStream, LogEvent): times ISO 8601 with milliseconds and Z, null fields left out.
"""
from __future__ import annotations

import argparse
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import shapes, state

# The head node's bootstrap logs as the cookbook's CloudWatch agent config names their streams.
CFN_INIT, CHEF_CLIENT = "cfn-init", "chef-client"
_FILTER = re.compile(r"^Name=(private-dns-name|node-type),Values=([\w\-_.,]+)$")
_STAMPS = (  # cfn-init: "2026-11-30 08:04:21,123 [INFO] ..."; chef-client: "[2026-11-30T08:04:21+00:00] INFO: ..."
    (re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})"), lambda m: f"{m[1]}.{m[2]}+00:00"),
    (re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d)\]"), lambda m: m[1]),
)


class LogsFailure(Exception):
    """Printed as pcluster's error JSON by the CLI (its Failure)."""


def _dir(cluster_dir: Path) -> Path:
    return Path(cluster_dir) / "cloudwatch"


def _streams(cluster_dir: Path) -> Path:
    return _dir(cluster_dir) / "streams"


# --- writers (CLI and create worker) ---------------------------------------------------------------

def stack_event(cluster_dir: Path, logical_id: str, resource_type: str, status: str, reason: str | None = None,
                physical_id: str | None = None, stack: tuple[str, str] | None = None) -> None:
    """Append one event; ``stack`` is (name, ARN), read from cluster.json when not given."""
    if stack is None:
        current = json.loads((Path(cluster_dir) / "cluster.json").read_text())
        stack = current["clusterName"], current["cloudformationStackArn"]
    name, arn = stack
    now = shapes.iso_now()
    is_stack = resource_type == "AWS::CloudFormation::Stack"
    event = {"stackId": arn, "eventId": str(uuid.uuid4()) if is_stack else f"{logical_id}-{status}-{now}",
             "stackName": name, "logicalResourceId": logical_id,
             "physicalResourceId": arn if is_stack else (physical_id or ""), "resourceType": resource_type,
             "timestamp": now, "resourceStatus": status}
    if reason:
        event["resourceStatusReason"] = reason
    _dir(cluster_dir).mkdir(parents=True, exist_ok=True)
    with open(_dir(cluster_dir) / "stack-events.jsonl", "a") as out:
        out.write(json.dumps(event) + "\n")


def stack_started(cluster_dir: Path, name: str, arn: str) -> None:
    stack_event(cluster_dir, name, "AWS::CloudFormation::Stack", "CREATE_IN_PROGRESS", "User Initiated",
                stack=(name, arn))


def stream_path(cluster_dir: Path, hostname: str, instance_id: str, log: str) -> Path:
    return _streams(cluster_dir) / f"{hostname}.{instance_id}.{log}"


def write_log(cluster_dir: Path, hostname: str, instance_id: str, log: str, lines: list[str]) -> Path:
    """Append lines (each already carrying its timestamp) to the stream's file."""
    path = stream_path(cluster_dir, hostname, instance_id, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.write("".join(line.rstrip("\n") + "\n" for line in lines))
    return path


def cfn_line(level: str, text: str) -> str:
    now = datetime.now(UTC)
    return f"{now:%Y-%m-%d %H:%M:%S},{now.microsecond // 1000:03d} [{level}] {text}"


def chef_line(level: str, text: str) -> str:
    return f"[{datetime.now(UTC).isoformat(timespec='seconds')}] {level}: {text}"


# --- readers (the three commands) ------------------------------------------------------------------

def _line_time(line: str, default: str) -> str:
    for pattern, iso in _STAMPS:
        if match := pattern.match(line):
            return shapes.iso_time(datetime.fromisoformat(iso(match)))
    return default


def _mtime(path: Path) -> str:
    return shapes.iso_time(datetime.fromtimestamp(path.stat().st_mtime, UTC))


def _log_group(current: dict[str, Any]) -> str:
    created = current["creationTime"].replace("-", "").replace("T", "").replace(":", "")[:12]
    return f"/aws/parallelcluster/{current['clusterName']}-{created}"


def get_cluster_stack_events(current: dict[str, Any], cluster_dir: Path) -> dict[str, Any]:
    path = _dir(cluster_dir) / "stack-events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {"events": events[::-1]}   # CloudFormation lists the newest first


def _filters(raw: list[str] | None, head_prefix: str | None) -> list[str] | None:
    """Name prefixes the filters allow (None: every stream); pcluster's form Name=a,Values=1,2."""
    prefixes: list[str] | None = None
    for item in raw or []:
        match = _FILTER.match(item)
        if not match:
            raise LogsFailure("Bad Request: filters parameter must be in the form "
                              "^(Name=(private-dns-name|node-type),Values=[\\w\\-_.,]+)"
                              "(\\s+Name=(private-dns-name|node-type),Values=[\\w\\-_.,]+)*$.")
        name, values = match[1], match[2].split(",")
        if name == "node-type":
            if values != ["HeadNode"]:
                raise LogsFailure("Bad Request: The only accepted value for node-type filter is HeadNode")
            wanted = [head_prefix] if head_prefix else []
        else:
            wanted = values
        prefixes = wanted if prefixes is None else [p for p in prefixes if p in wanted]
    return prefixes


def list_cluster_log_streams(current: dict[str, Any], cluster_dir: Path, filters: list[str] | None,
                             head_prefix: str | None) -> dict[str, Any]:
    prefixes = _filters(filters, head_prefix)
    group = _log_group(current)
    account = current["cloudformationStackArn"].split(":")[4] if current.get("cloudformationStackArn") else ""
    streams = []
    directory = _streams(cluster_dir)
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if prefixes is not None and not any(path.name.startswith(p + ".") for p in prefixes):
            continue
        lines = path.read_text(errors="replace").splitlines()
        last = _mtime(path)
        first = _line_time(lines[0], last) if lines else last
        streams.append({
            "logStreamName": path.name, "creationTime": first, "firstEventTimestamp": first,
            "lastEventTimestamp": _line_time(lines[-1], last) if lines else last, "lastIngestionTime": last,
            "uploadSequenceToken": str(49600000000000000000000000000000000000000000000000000000 + len(lines)),
            "logStreamArn": f"arn:aws:logs:{current['region']}:{account}:log-group:{group}:log-stream:{path.name}",
        })
    return {"logStreams": streams}


def get_cluster_log_events(cluster_dir: Path, stream: str, limit: int | None, start_from_head: bool | None,
                           next_token: str | None) -> dict[str, Any]:
    """CloudWatch GetLogEvents: a page in time order, from the tail unless start_from_head; tokens f/<i>, b/<i>."""
    path = _streams(cluster_dir) / stream
    if "/" in stream or not path.is_file():
        raise LogsFailure(f"The specified log stream {stream} does not exist.")
    if limit is not None and limit <= 0:
        raise LogsFailure("Bad Request: 'limit' must be a positive integer.")
    lines = path.read_text(errors="replace").splitlines()
    size = min(limit or 10000, 10000)
    if next_token and re.fullmatch(r"[fb]/\d+", next_token):
        index = int(next_token[2:])
        start, end = (index, index + size) if next_token[0] == "f" else (max(0, index - size), index)
    elif next_token:
        raise LogsFailure("Bad Request: The specified nextToken is invalid.")
    elif start_from_head:
        start, end = 0, size
    else:
        start, end = max(0, len(lines) - size), len(lines)
    end = min(end, len(lines))
    default = _mtime(path)
    events = [{"timestamp": _line_time(line, default), "message": line} for line in lines[start:end]]
    return {"events": events, "nextToken": f"f/{end}", "prevToken": f"b/{start}"}


# --- command line ----------------------------------------------------------------------------------

def add_commands(command: Callable[..., argparse.ArgumentParser], add_name: Callable[[argparse.ArgumentParser], None],
                 func: Callable[[argparse.Namespace], dict[str, Any]], boolean: Callable[[str], bool]) -> None:
    """The three subcommands, with pcluster's arguments; ``func`` dispatches on ``args.operation``."""
    events = command("get-cluster-stack-events", func, "Retrieve the events associated with the stack for a given cluster.")
    add_name(events)
    events.add_argument("--next-token")
    streams = command("list-cluster-log-streams", func, "Retrieve the list of log streams associated with a cluster.")
    add_name(streams)
    streams.add_argument("--filters", nargs="+")
    streams.add_argument("--next-token")
    log_events = command("get-cluster-log-events", func, "Retrieve the events associated with a log stream.")
    add_name(log_events)
    log_events.add_argument("--log-stream-name", required=True)
    log_events.add_argument("--next-token")
    log_events.add_argument("--start-from-head", type=boolean)
    log_events.add_argument("--limit", type=int)
    log_events.add_argument("--start-time")
    log_events.add_argument("--end-time")


def run_command(args: argparse.Namespace, current: dict[str, Any], cluster_dir: Path) -> dict[str, Any]:
    if args.operation == "get-cluster-stack-events":
        return get_cluster_stack_events(current, cluster_dir)
    if args.operation == "list-cluster-log-streams":
        return list_cluster_log_streams(current, cluster_dir, args.filters, head_prefix(cluster_dir))
    return get_cluster_log_events(cluster_dir, args.log_stream_name, args.limit, args.start_from_head, args.next_token)


def head_prefix(cluster_dir: Path) -> str | None:
    """Short private DNS name of the head node, as the node-type=HeadNode filter uses it."""
    head = _dir(cluster_dir) / "head.json"
    return json.loads(head.read_text())["hostname"] if head.exists() else None


def remember_head(cluster_dir: Path, hostname: str, instance_id: str) -> None:
    _dir(cluster_dir).mkdir(parents=True, exist_ok=True)
    state.write_json_atomic(_dir(cluster_dir) / "head.json", {"hostname": hostname, "instance_id": instance_id})
