"""What a deleted cluster cost, from EC2: delete_cluster's accounting (docs/operations.md, Cost).

One sequence of reads and writes (``_bill``): the cluster's instances from EC2, the bill
(``run.cost.instance_usage``), then ``usage.json`` beside the run's results and results.json's
``usage``. delete_cluster's worker drives it over the sync hooks (``record_usage``), the trigger
that ends delete_cluster over aiobotocore (``arecord_usage``): the same bill either way.

A teardown must finish its job whatever the accounting does: a failure to read EC2 or to write S3
is a warning in the log and leaves ``usage`` None (or results.json without it), never a failed delete.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Generator, Mapping
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.cluster_instances import CLUSTER_NAME_TAG, ClusterInstancesHook
from ultracluster.parsers.ec2 import instance_life
from ultracluster.run.contracts import RESULTS_FILE, USAGE_FILE
from ultracluster.run.cost import instance_usage, prices_for_billing
from ultracluster.run.s3 import split_s3_uri

AWS_ERRORS = (BotoCoreError, ClientError)
# The requests of a bill: (INSTANCES,) -> the instances; (READ, bucket, key) -> text or None when
# missing; (WRITE, bucket, key, text) -> None.
INSTANCES, READ, WRITE = "instances", "read", "write"
Bill = Generator[tuple, Any, "dict[str, Any] | None"]


def _fsx_gib(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "", "None") else None
    except (TypeError, ValueError):
        return None


def _bill(log: Any, spec: Mapping[str, Any], deleted_at: str) -> Bill:
    """``spec``: ``cluster_name``, ``results_uri`` (None: XCom only), ``fsx_storage_capacity_gib``."""
    name = spec["cluster_name"]
    try:
        instances = yield (INSTANCES,)
    except AWS_ERRORS as err:
        log.warning("Actual cost unknown: describe-instances of cluster %s failed: %s", name, err)
        return None
    if not instances:
        log.warning("No cost recorded: EC2 lists no instance tagged %s=%s (none was launched, or they ended "
                    "over an hour ago and EC2 no longer lists them)", CLUSTER_NAME_TAG, name)
        return None
    prices = prices_for_billing(log.warning, "Instance-hours")
    now = datetime.now(timezone.utc)
    usage = instance_usage([instance_life(i, now) for i in instances], prices, _fsx_gib(spec["fsx_storage_capacity_gib"]))
    usage.update(cluster_name=name, measured_at=deleted_at)
    money = {k: "unknown" if usage[k] is None else f"{usage[k]:.2f}"
             for k in ("usd", "compute_usd", "head_node_usd", "fsx_usd")}
    log.info("Cluster %s used %.3f instance-hours (compute nodes %.3f h, head node %.3f h) over %d instances: "
             "$%s (compute $%s, head node $%s, FSx $%s)%s", name, usage["instance_hours"], usage["compute_node_hours"],
             usage["head_node_hours"], usage["instances"], money["usd"], money["compute_usd"], money["head_node_usd"],
             money["fsx_usd"], f"; no price for {', '.join(usage['unpriced_types'])}" if usage["unpriced_types"] else "")
    if usage["unended"]:
        log.warning("%d instance(s) of %s not terminated yet: counted up to now", usage["unended"], name)
    yield from _write_beside_results(log, spec.get("results_uri"), usage)
    return usage


def _write_beside_results(log: Any, uri: str | None, usage: Mapping[str, Any]) -> Generator[tuple, Any, None]:
    """usage.json in the run's results folder, and results.json's ``usage`` key (no ``uri``: neither)."""
    if not uri or uri == "None":
        return
    try:
        bucket, prefix = split_s3_uri(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        yield (WRITE, bucket, prefix + USAGE_FILE, json.dumps(usage, indent=2))
        text = yield (READ, bucket, prefix + RESULTS_FILE)
        if text is not None:
            yield (WRITE, bucket, prefix + RESULTS_FILE, json.dumps({**json.loads(text), "usage": usage}, indent=2))
        log.info("Usage written to s3://%s/%s%s and into %s", bucket, prefix, USAGE_FILE, RESULTS_FILE)
    except (*AWS_ERRORS, ValueError) as err:
        log.warning("Usage not written beside the results in %s: %s", uri, err)


async def _drive(bill: Bill, do: Callable[[tuple], Awaitable[Any]]) -> dict[str, Any] | None:
    """Answer each of the bill's requests with ``do``; its AWS errors go back into the bill, which
    decides what they mean."""
    try:
        request = next(bill)
        while True:
            try:
                response = await do(request)
            except (*AWS_ERRORS, ValueError) as err:
                request = bill.throw(err)
            else:
                request = bill.send(response)
    except StopIteration as done:
        return done.value


def _sync(spec: Mapping[str, Any]) -> Callable[[tuple], Awaitable[Any]]:
    """The requests answered over the sync hooks (a worker: nothing else runs meanwhile)."""
    s3 = ArtifactsS3Hook(aws_conn_id=spec["aws_conn_id"], sse=spec.get("s3_encryption"))

    async def do(request: tuple) -> Any:
        if request[0] == INSTANCES:
            return ClusterInstancesHook(aws_conn_id=spec["aws_conn_id"], region_name=spec.get("region_name") or None
                                        ).describe_instances(spec["cluster_name"])
        if request[0] == READ:
            return s3.read_key(request[2], bucket_name=request[1]) if s3.check_for_key(request[2], request[1]) else None
        return s3.load_string(request[3], key=request[2], bucket_name=request[1], replace=True)

    return do


def record_usage(log: Any, spec: Mapping[str, Any], deleted_at: str) -> dict[str, Any] | None:
    """The bill over the sync hooks; ``spec`` as ``_bill``'s, with ``aws_conn_id``, ``region_name`` and
    ``s3_encryption``. Returns the usage (``cost.instance_usage`` plus ``cluster_name``, ``measured_at``)."""
    return asyncio.run(_drive(_bill(log, spec, deleted_at), _sync(spec)))


def write_beside_results(log: Any, spec: Mapping[str, Any], usage: Mapping[str, Any]) -> None:
    """Any bill (a run's Slurm jobs on an existing cluster: operators.usage) written where ``_bill``
    writes its own, over the sync hooks; ``spec``: ``results_uri``, ``aws_conn_id``, ``s3_encryption``."""
    asyncio.run(_drive(_write_beside_results(log, spec.get("results_uri"), usage), _sync(spec)))


async def arecord_usage(log: Any, spec: Mapping[str, Any], deleted_at: str) -> dict[str, Any] | None:
    """``record_usage`` over aiobotocore (in a trigger: nothing blocks the event loop)."""
    ec2 = ClusterInstancesHook(aws_conn_id=spec["aws_conn_id"], region_name=spec.get("region_name") or None)
    s3 = ArtifactsS3Hook(aws_conn_id=spec["aws_conn_id"], sse=spec.get("s3_encryption"))

    async def do(request: tuple) -> Any:
        if request[0] == INSTANCES:
            async with await ec2.get_async_conn() as client:
                pages = client.get_paginator("describe_instances").paginate(
                    Filters=[{"Name": f"tag:{CLUSTER_NAME_TAG}", "Values": [spec["cluster_name"]]}])
                return [i async for page in pages for r in page["Reservations"] for i in r["Instances"]]
        async with await s3.get_async_conn() as client:
            if request[0] == WRITE:
                return await client.put_object(Bucket=request[1], Key=request[2], Body=request[3].encode(), **s3.sse)
            try:
                got = await client.get_object(Bucket=request[1], Key=request[2])
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            return (await got["Body"].read()).decode()

    return await _drive(_bill(log, spec, deleted_at), do)
