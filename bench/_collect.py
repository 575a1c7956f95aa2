"""One pipeline run's records, gathered from where each is kept (bench/pipeline.py analyses them):

- Airflow (REST): the run, its task instances, the wait tasks' logs (worker and trigger lines);
- the local cluster's ledgers in <home>/logs/: clusters.jsonl (create call, delete done),
  pcluster-calls.jsonl (every pcluster CLI call), moto.log (every AWS request, whole seconds);
- what ClusterWatch kept from the cluster dir before the delete removed it: status transitions,
  Slurm's job completion log, sshd's accepted connections;
- moto's CloudFormation: the network stack's DeletionTime;
- moto's S3: the run's results.json (collect_results' upload), for the first step's time.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

import _timeline as tl
import boto3
from _first_step import first_step_mark

from ultracluster.run.names import vpc_stack_name_for

DAG_ID = "trn1_bert_pretrain"
# wait -> (its task, the tasks that start once it is done; none: the run's end)
WAITS = {
    "create": ("pcluster_create", ("wait_for_fleet",)),
    "fleet": ("wait_for_fleet", ("download_data", "restore_compile_cache", "restore_checkpoint")),
    "compile": ("parallel_compile", ("train",)),
    "train": ("train", ("collect_results", "save_compile_cache")),
    "delete_cluster": ("delete_cluster", ("delete_vpc",)),
    "delete_vpc": ("delete_vpc", ()),
}


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stack_deleted(env: dict, stack_name: str) -> float | None:
    """The stack's DELETE_COMPLETE event in moto (its list_stacks has no DeletionTime; a deleted
    stack's events are still served by its id)."""
    client = boto3.client("cloudformation", endpoint_url=env["AWS_ENDPOINT_URL"],
                          region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    ids = [s["StackId"] for page in client.get_paginator("list_stacks").paginate(StackStatusFilter=["DELETE_COMPLETE"])
           for s in page["StackSummaries"] if s["StackName"] == stack_name]
    times = [e["Timestamp"].timestamp() for stack_id in ids
             for e in client.describe_stack_events(StackName=stack_id)["StackEvents"]
             if e["ResourceStatus"] == "DELETE_COMPLETE" and e["LogicalResourceId"] == stack_name]
    return max(times) if times else None


def _results_json(env: dict, collected: dict | None) -> dict | None:
    """The results.json collect_results uploaded (its XCom names the folder), None if there is none."""
    uri = (collected or {}).get("artifacts_uri") if isinstance(collected, dict) else None
    if not uri:
        return None
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env.get("AWS_DEFAULT_REGION"),
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        return json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}results.json")["Body"].read())
    except client.exceptions.NoSuchKey:
        return None


def collect(deployment, watch, run: dict) -> dict:
    """The records of one ended run of trn1_bert_pretrain, as plain data (times: POSIX seconds)."""
    run_id = run["dag_run_id"]
    tis = {ti["task_id"]: ti for ti in deployment.task_instances(DAG_ID, run_id)}
    logs = {}
    for task, _next in WAITS.values():
        ti = tis.get(task)
        if ti and ti.get("try_number"):
            logs[task] = tl.log_events(deployment.task_log(DAG_ID, run_id, task, ti["try_number"]))
    xcoms = {}
    # Did the warm run find the cold run's cache? Where did collect_results put results.json? When did
    # wait_for_fleet see the fleet ready?
    for task in ("restore_compile_cache", "parallel_compile", "collect_results", "wait_for_fleet"):
        path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task}/xcomEntries/return_value"
        value = (deployment.client.get(path, missing_ok=True) or {}).get("value")
        xcoms[task] = json.loads(value) if isinstance(value, str) and value.startswith("{") else value
    home = deployment.home
    ledger = [e for e in _jsonl(home / "logs" / "clusters.jsonl")
              if e.get("tags", {}).get("ultracluster:run-id") == run_id]
    name = ledger[0]["cluster"] if ledger else None
    when = {e["event"]: tl.parse_time(e["time"]) for e in ledger}
    statuses = watch.status.get(name, [])
    status_time = {}
    for seen in statuses:  # the first time the cluster recorded each status
        status_time.setdefault(seen["status"], tl.parse_time(seen["time"]))
    calls = [c for c in _jsonl(home / "logs" / "pcluster-calls.jsonl") if c.get("cluster") == name]
    moto_log = home / "logs" / "moto.log"
    env = dict(deployment.env, AWS_DEFAULT_REGION=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    return {
        "run_id": run_id, "state": run["state"], "cluster": name,
        "queued": tl.parse_time(run.get("queued_at")),
        "start": tl.parse_time(run["start_date"]), "end": tl.parse_time(run["end_date"]),
        "tis": {task: {"state": ti["state"], "start": tl.parse_time(ti.get("start_date")),
                       "end": tl.parse_time(ti.get("end_date")), "duration": ti.get("duration")}
                for task, ti in tis.items()},
        "logs": logs, "xcoms": xcoms,
        "created": when.get("created"), "deleted": when.get("deleted"),
        "create_complete": status_time.get("CREATE_COMPLETE"),
        "delete_requested": next((tl.parse_time(c["time"]) for c in calls if c["command"] == "delete-cluster"),
                                 status_time.get("DELETE_IN_PROGRESS")),
        "calls": [tl.parse_time(c["time"]) for c in calls],
        "jobs": tl.jobcomp(watch.jobcomp.get(name, "")),
        "ssh": list(watch.ssh_accepted.get(name, [])), "ssh_resolution": watch.period,
        "aws": tl.moto_request_times(moto_log.read_text(errors="replace")) if moto_log.exists() else [],
        "stack_deleted": _stack_deleted(env, vpc_stack_name_for(run_id)),
        "first_step": first_step_mark(_results_json(env, xcoms.get("collect_results"))),
    }
