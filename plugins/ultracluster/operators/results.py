"""collect_results: results.json, the per-node logs and the final checkpoint go to S3; the key
metrics become the return value and an Asset event.

Transfer choice: presigned PUT URLs per file (S3Hook, in the worker) and curl on the head node.
The data goes head node -> S3 directly; a checkpoint can be gigabytes and SFTP through the worker
would carry it twice over the network and through a worker slot. The URLs are secrets: they go to
curl on stdin, never into a command line, a log or XCom. results.json itself is also read over SSH
(it is small) to compute the metrics.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.links import S3ResultsLink, SweepReportLink
from ultracluster.operators._remote_transfer import RemoteTransferMixin
from ultracluster.s3_encryption import check_sse

if TYPE_CHECKING:
    from airflow.sdk import Context

_NODE_LOG = re.compile(r"(^|/)log_[^/]*$")
_CHECKPOINT = re.compile(r"(ckpt|checkpoint)|\.(pt|pth|bin|safetensors)$", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


def _metric_values(metrics: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    values = []
    for metric in metrics:
        if str(metric.get("MetricName", "")).strip().lower() == name.lower():
            try:
                values.append(float(metric["MeasuredValue"]))
            except (KeyError, TypeError, ValueError):
                continue
    return values


def _param(parameters: Mapping[str, Any], *names: str) -> Any:
    lowered = {str(k).strip().lower(): v for k, v in parameters.items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def _int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def extract_metrics(
    results: Mapping[str, Any], *, num_nodes: int | None = None, scaling_mode: str | None = None
) -> dict[str, Any]:
    """Key metrics from a blog-era results.json:
    ``{"results": {"parameters": {...}, "metrics": [{"MetricName", "MeasuredValue", "Units", ...}]}}``.

    Final values win over running ones: "Final loss" else the last "Loss"; "Average throughput"
    else the mean of "Throughput"; "Peak throughput" else their maximum.
    """
    body = results.get("results")
    if not isinstance(body, Mapping) or not isinstance(body.get("metrics"), list):
        raise ValueError("results.json has no results.metrics list (blog-era schema expected)")
    parameters = body.get("parameters") or {}
    metrics = body["metrics"]
    losses = _metric_values(metrics, "Loss")
    throughputs = _metric_values(metrics, "Throughput")
    final_loss = (_metric_values(metrics, "Final loss") or losses[-1:] or [None])[-1]
    average = (_metric_values(metrics, "Average throughput") or [None])[-1]
    if average is None and throughputs:
        average = sum(throughputs) / len(throughputs)
    peak = (_metric_values(metrics, "Peak throughput") or [None])[-1]
    if peak is None and throughputs:
        peak = max(throughputs)
    time_to_train = (_metric_values(metrics, "Time to train") or [None])[-1]

    world_size = _int(_param(parameters, "World size"))
    batch = _int(_param(parameters, "Batch size"))
    accumulation = _int(_param(parameters, "Gradient accumulation microsteps"))
    global_batch = _int(_param(parameters, "Global batch size", "Global batch"))
    if global_batch is None and None not in (world_size, batch, accumulation):
        global_batch = world_size * batch * accumulation
    nodes = num_nodes or _int(_param(parameters, "Nodes", "Number of nodes", "Num nodes"))
    mode = scaling_mode or _param(parameters, "Scaling mode", "Scaling")
    total_steps = _int(_param(parameters, "Total steps"))
    start, end = _int(_param(parameters, "Start step")), _int(_param(parameters, "End step"))
    steps = end - start if None not in (start, end) else None
    # A bounded run (a sweep point: steps_this_run < max_steps) measures throughput; the full run's
    # time to train is then extrapolated from it, and marked so.
    extrapolated = bool(steps and total_steps and (start or end < total_steps))
    if extrapolated and average and global_batch:
        time_to_train = total_steps * global_batch / average / 60.0
    return {
        "final_loss": final_loss,
        "average_throughput_seq_per_s": average,
        "peak_throughput_seq_per_s": peak,
        "time_to_train_min": time_to_train,
        "nodes": nodes,
        "world_size": world_size,
        "global_batch": global_batch,
        "scaling_mode": mode,
        "total_steps": total_steps,
        "steps": steps,
        "time_to_train_extrapolated": extrapolated,
        "sweep": parameters.get("Sweep"),
    }


def summary_table(metrics: Mapping[str, Any]) -> str:
    labels = {
        "final_loss": "Final loss",
        "average_throughput_seq_per_s": "Average throughput (seq/s)",
        "peak_throughput_seq_per_s": "Peak throughput (seq/s)",
        "time_to_train_min": "Time to train (min)",
        "time_to_train_extrapolated": "Time to train extrapolated",
        "nodes": "Nodes",
        "world_size": "World size",
        "global_batch": "Global batch",
        "scaling_mode": "Scaling mode",
        "total_steps": "Total steps",
    }
    rows = []
    for key, label in labels.items():
        value = metrics.get(key)
        text = "-" if value is None else (f"{value:,.4f}" if isinstance(value, float) else str(value))
        rows.append((label, text))
    width = max(len(label) for label, _ in rows)
    value_width = max(len(text) for _, text in rows)
    rule = f"+-{'-' * width}-+-{'-' * value_width}-+"
    body = "\n".join(f"| {label.ljust(width)} | {text.rjust(value_width)} |" for label, text in rows)
    return f"{rule}\n{body}\n{rule}"


def select_artifacts(files: Mapping[str, int], results_name: str = "results.json") -> list[str]:
    """results.json, every per-node log, and the final checkpoint (highest step number, else all).

    Hidden files (``.ckpt_40.pt.tmp``: a checkpoint being written) are never picked.
    """
    files = {p: size for p, size in files.items() if not posixpath.basename(p).startswith(".")}
    chosen = [p for p in files if posixpath.basename(p) == results_name]
    chosen += [p for p in files if _NODE_LOG.search(p)]
    taken = set(chosen)  # a set: a list lookup per file made this quadratic in the node count
    checkpoints = [p for p in files if _CHECKPOINT.search(p) and p not in taken]

    def step(path: str) -> int:
        numbers = _NUMBER.findall(path)
        return int(numbers[-1]) if numbers else -1

    if checkpoints:
        # A checkpoint may span several files (shards): keep every file of the newest one.
        newest = max(step(p) for p in checkpoints)
        chosen += [p for p in checkpoints if step(p) == newest]
    return sorted(dict.fromkeys(chosen))


class CollectResultsOperator(RemoteTransferMixin, BaseOperator):
    """Upload a training job's results and report its key metrics.

    :param head_node: the dict wait_for_fleet returned.
    :param train: the dict SlurmJobOperator returned (job_id, output_dir, log_path, results_path).
    :param artifacts_s3_uri: ``s3://bucket[/prefix]``; files go under
        ``<prefix>/results/<dag_id>/<safe run id>/`` (the config's run slug).
    :param aws_conn_id: S3Hook connection.
    :param s3_encryption: server-side encryption of every upload (``s3_encryption.sse_args``; None: SSE-S3).
    :param ssh_conn_id: SSH connection of the head node.
    :param num_nodes: nodes of the run (else read from results.json).
    :param scaling_mode: ``strong``/``weak`` (else read from results.json).
    """

    template_fields: Sequence[str] = ("head_node", "train", "artifacts_s3_uri", "num_nodes", "scaling_mode")
    ui_color = "#e8daef"
    operator_extra_links = (S3ResultsLink(), SweepReportLink())

    def __init__(
        self,
        *,
        head_node: dict[str, Any] | str,
        train: dict[str, Any] | str,
        artifacts_s3_uri: str,
        aws_conn_id: str | None = "aws_default",
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        num_nodes: int | str | None = None,
        scaling_mode: str | None = None,
        presigned_url_expiry: int = 6 * 3600,
        transfer_timeout: float = 6 * 3600,
        s3_encryption: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.s3_encryption = check_sse(s3_encryption)
        self.head_node = head_node
        self.train = train
        self.artifacts_s3_uri = artifacts_s3_uri
        self.aws_conn_id = aws_conn_id
        self.ssh_conn_id = ssh_conn_id
        self.num_nodes = num_nodes
        self.scaling_mode = scaling_mode
        self.presigned_url_expiry = presigned_url_expiry
        # A silent curl uploading a multi-GB checkpoint prints nothing for a long time.
        self.transfer_timeout = transfer_timeout

    def _destination(self, context: Context) -> tuple[str, str]:
        from ultracluster.operators.config import run_artifacts_location

        ti = context["ti"]
        try:
            return run_artifacts_location(self.artifacts_s3_uri, ti.dag_id, ti.run_id, "results")
        except ValueError:
            raise ValueError(f"artifacts_s3_uri must be s3://bucket[/prefix], got {self.artifacts_s3_uri!r}") from None

    def execute(self, context: Context) -> dict[str, Any]:
        from ultracluster import remote_commands
        from ultracluster.hooks.artifacts import ArtifactsS3Hook
        from ultracluster.hooks.head_node import HeadNodeHook
        from ultracluster.parsers.files import parse_file_listing

        if not isinstance(self.train, Mapping) or not self.train.get("output_dir"):
            raise ValueError(f"train must be the dict SlurmJobOperator returned, got {self.train!r}")
        bucket, prefix = self._destination(context)
        head_node = HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node)
        output_dir = self.train["output_dir"]
        results_path = self.train.get("results_path") or posixpath.join(output_dir, "results.json")

        text = head_node.check(remote_commands.read_file(results_path)).stdout
        if not text.strip():
            raise AirflowException(f"{results_path} is missing or empty on the head node")
        try:
            metrics = extract_metrics(
                json.loads(text),
                num_nodes=int(self.num_nodes) if self.num_nodes not in (None, "") else None,
                scaling_mode=self.scaling_mode,
            )
        except ValueError as err:
            raise AirflowException(f"Cannot read metrics from {results_path}: {err}") from err
        metrics["job_id"] = self.train.get("job_id")
        s3 = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption)
        # The folder is linked before the upload: a failed one leaves what it put there to look at.
        S3ResultsLink.persist(context=context, region_name=s3.conn_region_name, bucket=bucket, prefix=prefix)
        sweep = metrics.get("sweep")
        if isinstance(sweep, Mapping) and sweep.get("id"):
            SweepReportLink.persist(context=context, dag_id=context["ti"].dag_id, sweep_id=sweep["id"])

        files = parse_file_listing(head_node.check(remote_commands.list_files(output_dir)).stdout)
        uploads = [(posixpath.join(output_dir, rel), rel) for rel in select_artifacts(files)]
        if results_path not in {local for local, _ in uploads}:
            uploads.append((results_path, posixpath.basename(results_path)))
        if self.train.get("log_path"):
            uploads.append((self.train["log_path"], posixpath.basename(self.train["log_path"])))
        pid_file = posixpath.join(output_dir, ".ultracluster-upload.pid")
        head_node.stop_remote_transfer(pid_file)  # an earlier try's curl, if it still runs
        self._upload(head_node, s3, bucket, prefix, uploads, pid_file)
        metrics["artifacts_uri"] = f"s3://{bucket}/{prefix}/"

        self.log.info("Training results (job %s):\n%s", metrics["job_id"], summary_table(metrics))
        for asset in self.outlets or []:
            context["outlet_events"][asset].extra = dict(metrics)
        return metrics

    def _upload(self, head_node, s3, bucket: str, prefix: str, uploads: list[tuple[str, str]], pid_file: str) -> None:
        self.upload_to_s3(head_node, s3, bucket, prefix, uploads, pid_file)
