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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ultracluster import remote_commands
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.head_node import HeadNodeHook
from ultracluster.links import S3ResultsLink, SweepReportLink
from ultracluster.operators.remote_transfer import RemoteTransferMixin
from ultracluster.parsers.files import parse_file_listing
from ultracluster.run.contracts import extract_metrics, select_artifacts
from ultracluster.run.names import run_artifacts_location
from ultracluster.run.s3 import check_sse

if TYPE_CHECKING:
    from airflow.sdk import Context

def summary_table(metrics: Mapping[str, Any]) -> str:
    labels = {
        "model": "Model",
        "device": "Device",
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
        ti = context["ti"]
        try:
            return run_artifacts_location(self.artifacts_s3_uri, ti.dag_id, ti.run_id, "results")
        except ValueError:
            raise ValueError(f"artifacts_s3_uri must be s3://bucket[/prefix], got {self.artifacts_s3_uri!r}") from None

    def execute(self, context: Context) -> dict[str, Any]:
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
