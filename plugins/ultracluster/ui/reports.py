"""The scaling reports in the artifacts bucket, as the Scaling reports page reads them.

``trn1_scaling_report`` writes ``<artifacts>/reports/<dag id>/<sweep id>/`` (report.md, report.html,
report.json, throughput.png; ultracluster/operators/scaling_report.py). A sweep is listed when its
``report.json`` is there. Ids are checked against strict patterns before any key is built from them.
"""
from __future__ import annotations

import json
import re
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ultracluster.run.sweep import SWEEP_ID_PATTERN, sweep_location

# A DAG id as the report DAG's source_dag_id param allows it, without a leading dot.
DAG_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}$"
_DAG_ID, _SWEEP_ID = re.compile(DAG_ID_PATTERN), re.compile(SWEEP_ID_PATTERN)
# How many sweeps the list page reads report.json of (newest first); older ones are only listed.
SUMMARISED = 50


class ReportsUnavailable(RuntimeError):
    """The artifacts bucket could not be read (not a missing report: the page says so and why)."""


def valid_ids(dag_id: str, sweep_id: str) -> bool:
    return bool(_DAG_ID.match(dag_id or "")) and bool(_SWEEP_ID.match(sweep_id or ""))


def reports_prefix(artifacts_s3_uri: str) -> tuple[str, str]:
    """Bucket and key prefix (no trailing slash) under which every sweep's report folder is."""
    bucket, prefix = sweep_location(artifacts_s3_uri, "reports", "", "")
    return bucket, prefix


def _client(s3: Any) -> Any:
    return s3.get_conn() if hasattr(s3, "get_conn") else s3


def _missing(err: Exception) -> bool:
    code = str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound")


def list_reports(s3: Any, artifacts_s3_uri: str) -> list[dict[str, Any]]:
    """Every reported sweep, newest report first: ``{"dag_id", "sweep_id", "modified", "summary"}``;
    ``summary`` (from report.json) for the newest ``SUMMARISED``, else None. Keys that do not
    parse as ``<dag id>/<sweep id>/report.json`` are ignored. ``s3``: an S3Hook or a boto3 client."""
    client = _client(s3)
    bucket, prefix = reports_prefix(artifacts_s3_uri)
    found = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
            for obj in page.get("Contents", []):
                parts = obj["Key"][len(prefix) + 1:].split("/")
                if len(parts) == 3 and parts[2] == "report.json" and valid_ids(parts[0], parts[1]):
                    found.append({"dag_id": parts[0], "sweep_id": parts[1], "modified": obj["LastModified"]})
    except ClientError as err:
        if _missing(err):
            return []
        raise ReportsUnavailable(f"cannot list s3://{bucket}/{prefix}/: {err}") from err
    except BotoCoreError as err:
        raise ReportsUnavailable(f"cannot list s3://{bucket}/{prefix}/: {err}") from err
    found.sort(key=lambda r: (r["modified"], r["dag_id"], r["sweep_id"]), reverse=True)
    for index, entry in enumerate(found):
        entry["modified"] = entry["modified"].isoformat(timespec="seconds")
        report = read_report(s3, artifacts_s3_uri, entry["dag_id"], entry["sweep_id"]) if index < SUMMARISED else None
        entry["summary"] = summarise(report) if report else None
    return found


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """What the list shows of one report."""
    rows = report.get("rows") or []
    return {
        "scaling_mode": report.get("scaling_mode"),
        "instance_type": report.get("instance_type"),
        "points": report.get("points") or [],
        "succeeded": sum(1 for r in rows if r.get("status") == "success"),
        "rows": len(rows),
        "partial": bool(report.get("partial")),
        "generated_at": report.get("generated_at"),
    }


def _object(s3: Any, artifacts_s3_uri: str, dag_id: str, sweep_id: str, name: str) -> bytes | None:
    if not valid_ids(dag_id, sweep_id):
        raise ValueError(f"invalid DAG id or sweep id: {dag_id!r}, {sweep_id!r}")
    bucket, prefix = sweep_location(artifacts_s3_uri, "reports", dag_id, sweep_id)
    try:
        return _client(s3).get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
    except ClientError as err:
        if _missing(err):
            return None
        raise ReportsUnavailable(f"cannot read s3://{bucket}/{prefix}/{name}: {err}") from err
    except BotoCoreError as err:
        raise ReportsUnavailable(f"cannot read s3://{bucket}/{prefix}/{name}: {err}") from err


def read_report(s3: Any, artifacts_s3_uri: str, dag_id: str, sweep_id: str) -> dict[str, Any] | None:
    """The sweep's report.json; None when there is none (or it is not a JSON object)."""
    body = _object(s3, artifacts_s3_uri, dag_id, sweep_id, "report.json")
    if body is None:
        return None
    try:
        report = json.loads(body)
    except ValueError:
        return None
    return report if isinstance(report, dict) and isinstance(report.get("rows"), list) else None


def read_plot(s3: Any, artifacts_s3_uri: str, dag_id: str, sweep_id: str) -> bytes | None:
    """The sweep's throughput.png; None when there is none."""
    return _object(s3, artifacts_s3_uri, dag_id, sweep_id, "throughput.png")
