"""save_failure_artifacts: a failed or cancelled run's checkpoints and logs go to S3 before teardown.

The cluster's shared storage (FSx) goes with the cluster, so whatever a failed run wrote there (its
newest checkpoint, per-node logs, Slurm logs) is lost once delete_cluster runs. This task is a
teardown of pcluster_create placed before delete_cluster: it runs whatever failed in between, and
also after a run is marked failed by hand (Airflow skips pending tasks then, but never teardowns).
It saves nothing when collect_results saved the run's results, and it cannot hold up the teardown:
delete_cluster runs after it whatever its own outcome (a teardown's failure does not fail the run).

The copy goes head node -> S3 directly with presigned PUTs, as collect_results does, under
``<artifacts prefix>/failed/<dag_id>/<safe run id>/`` with the paths relative to the job directory.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from ultracluster import remote_commands
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.head_node import HeadNodeHook
from ultracluster.links import S3ResultsLink
from ultracluster.operators.remote_transfer import RemoteTransferMixin
from ultracluster.parsers.files import parse_file_listing
from ultracluster.run.contracts import select_failure_artifacts
from ultracluster.run.names import run_artifacts_location
from ultracluster.run.s3 import check_sse

if TYPE_CHECKING:
    from airflow.sdk import Context

FAILED_KIND = "failed"  # the S3 prefix part: <prefix>/failed/<dag_id>/<safe run id>/
class SaveFailureArtifactsOperator(RemoteTransferMixin, BaseOperator):
    """Copy a failed run's job directory essentials from the head node to S3.

    :param head_node: the dict wait_for_fleet returned; None (the fleet never came up): skipped.
    :param job_dir: the run's job directory on shared storage (JOB_DIR: compile and train jobs).
    :param artifacts_s3_uri: ``s3://bucket[/prefix]``.
    :param collected: collect_results' XCom; when it holds ``artifacts_uri`` the run's results and
        checkpoint are saved already, and this task copies nothing.
    Returns ``{"artifacts_uri", "files", "bytes"}`` (``artifacts_uri`` None: nothing copied).
    """
    template_fields: Sequence[str] = ("head_node", "job_dir", "artifacts_s3_uri", "collected")
    ui_color = "#f5b7b1"
    operator_extra_links = (S3ResultsLink(),)

    def __init__(
        self,
        *,
        head_node: dict[str, Any] | str | None,
        job_dir: str,
        artifacts_s3_uri: str,
        collected: dict[str, Any] | str | None = None,
        aws_conn_id: str | None = "aws_default",
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        presigned_url_expiry: int = 3 * 3600,
        # The cluster waits for this copy: bounded, so a stuck upload cannot keep it alive for long.
        transfer_timeout: float = 3600,
        s3_encryption: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.s3_encryption = check_sse(s3_encryption)  # of every upload (docs/operations.md, "Encryption")
        self.head_node = head_node
        self.job_dir = job_dir
        self.artifacts_s3_uri = artifacts_s3_uri
        self.collected = collected
        self.aws_conn_id = aws_conn_id
        self.ssh_conn_id = ssh_conn_id
        self.presigned_url_expiry = presigned_url_expiry
        self.transfer_timeout = transfer_timeout

    def execute(self, context: Context) -> dict[str, Any]:
        if isinstance(self.collected, Mapping) and self.collected.get("artifacts_uri"):
            # The run's normal end: a success with nothing to do (a skip would read as "did not run").
            self.log.info("Nothing failed: collect_results saved this run to %s", self.collected["artifacts_uri"])
            return {"artifacts_uri": None, "files": [], "bytes": 0}
        if not isinstance(self.head_node, Mapping) or not self.head_node.get("address"):
            raise AirflowSkipException("No head node (wait_for_fleet did not finish): no job ran on the cluster")
        if not posixpath.isabs(self.job_dir or ""):
            raise ValueError(f"job_dir must be an absolute path on shared storage, got {self.job_dir!r}")
        ti = context["ti"]
        try:
            bucket, prefix = run_artifacts_location(self.artifacts_s3_uri, ti.dag_id, ti.run_id, FAILED_KIND)
        except ValueError:
            raise ValueError(f"artifacts_s3_uri must be s3://bucket[/prefix], got {self.artifacts_s3_uri!r}") from None

        head_node = HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node)
        files = parse_file_listing(head_node.check(remote_commands.list_files(self.job_dir)).stdout)
        chosen = select_failure_artifacts(files)
        if not chosen:
            raise AirflowSkipException(f"Nothing to save: no job files under {self.job_dir}")
        s3 = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption)
        S3ResultsLink.persist(context=context, region_name=s3.conn_region_name, bucket=bucket, prefix=prefix)
        pid_file = posixpath.join(self.job_dir, ".ultracluster-failure-upload.pid")
        head_node.stop_remote_transfer(pid_file)  # an earlier try's curl, if it still runs
        uploads = [(posixpath.join(self.job_dir, rel), rel) for rel in chosen]
        self.upload_to_s3(head_node, s3, bucket, prefix, uploads, pid_file)
        uri = f"s3://{bucket}/{prefix}/"
        self.log.info("Saved this failed run's %d file(s) to %s:\n  %s", len(chosen), uri, "\n  ".join(chosen))
        return {"artifacts_uri": uri, "files": chosen, "bytes": sum(files[rel] for rel in chosen)}
