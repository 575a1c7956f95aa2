"""save_failure_artifacts: what a failed run leaves on shared storage reaches S3 (presigned PUTs from
S3Hook, curl run by a local bash as the head node, the real moto S3 server), or the task skips."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from tests.integration.test_dataset import stop_leftover_transfers  # noqa: F401 - autouse fixture
from tests.integration.test_results import HEAD, artifacts, head  # noqa: F401 - fixtures
from ultracluster.operators.failure_artifacts import SaveFailureArtifactsOperator
from ultracluster.run.contracts import select_failure_artifacts
from ultracluster.run.names import safe_run_id

RUN_ID = "manual__2026-12-01T08:00:00+00:00"
PREFIX = f"failed/trn1_bert_pretrain/{safe_run_id(RUN_ID)}/"


def failed_job_dir(tmp_path):
    """A compile job that finished and a train job that died after its checkpoint at step 20."""
    job_dir = tmp_path / "fsx" / "ultracluster" / "trn1_bert_pretrain" / "run"
    compile_out, train_out = job_dir / "output_3", job_dir / "output_4"
    (compile_out).mkdir(parents=True)
    (train_out / "checkpoints").mkdir(parents=True)
    (compile_out / "log_ph1_bf16_0_2").write_text("compile rank 0\n")
    for rank in range(2):
        (train_out / f"log_ph1_bf16_{rank}_2").write_text(f"rank {rank} died\n")
    (train_out / "checkpoints" / "ckpt_10.pt").write_bytes(b"older")
    (train_out / "checkpoints" / "ckpt_20.pt").write_bytes(b"newest checkpoint")
    (train_out / "checkpoints" / ".ckpt_30.pt.tmp").write_bytes(b"half written")
    (train_out / "events.out.tfevents.1").write_bytes(b"not kept")
    for job_id, kind, text in [(3, "out", "compiled\n"), (3, "exit", "0\n"), (4, "out", "Traceback: NCCL\n"),
                               (4, "exit", "1\n")]:
        (job_dir / f"slurm-{job_id}.{kind}").write_text(text)
    (job_dir / ".ultracluster-failure-upload.pid").write_text("")  # a hidden file is never copied
    return job_dir


def context(pushed=None):
    pushed = {} if pushed is None else pushed
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=RUN_ID, task_id="save_failure_artifacts",
                         xcom_push=lambda key, value: pushed.__setitem__(key, value))
    return {"ti": ti}


def operator(job_dir, **kwargs):
    return SaveFailureArtifactsOperator(
        task_id="save_failure_artifacts", head_node=kwargs.pop("head_node", HEAD), job_dir=str(job_dir),
        artifacts_s3_uri="s3://ultracluster-artifacts", aws_conn_id="uc_test_aws", **kwargs)


def test_selection_keeps_slurm_files_logs_and_each_jobs_newest_checkpoint():
    files = {"slurm-4.out": 1, "slurm-4.exit": 1, "slurm-4.sbatch.tmp.x": 1, "notes.txt": 1,
             "output_4/log_ph1_bf16_0_2": 1, "output_4/checkpoints/ckpt_10.pt": 1,
             "output_4/checkpoints/ckpt_20.pt": 1, "output_4/checkpoints/.ckpt_30.pt.tmp": 1,
             "output_5/results.json": 1, ".cache/x.pt": 1}
    assert select_failure_artifacts(files) == [
        "output_4/checkpoints/ckpt_20.pt", "output_4/log_ph1_bf16_0_2", "output_5/results.json",
        "slurm-4.exit", "slurm-4.out"]


def test_a_failed_runs_files_are_copied_under_the_failed_prefix(tmp_path, artifacts, head, capsys):  # noqa: F811
    from ultracluster.links import S3ResultsLink

    job_dir = failed_job_dir(tmp_path)
    pushed = {}
    result = operator(job_dir, collected=None).execute(context(pushed))

    keys = sorted(o["Key"] for o in artifacts.list_objects_v2(Bucket="ultracluster-artifacts")["Contents"])
    assert keys == [PREFIX + rel for rel in [
        "output_3/log_ph1_bf16_0_2", "output_4/checkpoints/ckpt_20.pt", "output_4/log_ph1_bf16_0_2",
        "output_4/log_ph1_bf16_1_2", "slurm-3.exit", "slurm-3.out", "slurm-4.exit", "slurm-4.out"]]
    body = artifacts.get_object(Bucket="ultracluster-artifacts", Key=PREFIX + "output_4/checkpoints/ckpt_20.pt")
    assert body["Body"].read() == b"newest checkpoint"
    assert result["artifacts_uri"] == f"s3://ultracluster-artifacts/{PREFIX}"
    assert len(result["files"]) == 8 and result["bytes"] == sum(
        (job_dir / rel).stat().st_size for rel in result["files"])
    assert pushed[S3ResultsLink.key]["prefix"] == PREFIX.rstrip("/")
    # The presigned URLs never reach a command line or the log.
    assert all("Signature=" not in c.shell for c in head.commands)
    assert "Signature=" not in capsys.readouterr().out


def test_nothing_is_copied_when_collect_results_saved_the_run(tmp_path, artifacts, head):  # noqa: F811
    job_dir = failed_job_dir(tmp_path)
    op = operator(job_dir, collected={"artifacts_uri": "s3://ultracluster-artifacts/results/x/"})
    assert op.execute(context()) == {"artifacts_uri": None, "files": [], "bytes": 0}
    assert head.commands == []
    assert "Contents" not in artifacts.list_objects_v2(Bucket="ultracluster-artifacts")


def test_no_head_node_means_nothing_ran_and_the_task_skips(tmp_path, head):  # noqa: F811
    with pytest.raises(AirflowSkipException, match="No head node"):
        operator(tmp_path, head_node=None).execute(context())
    assert head.commands == []


def test_an_empty_job_dir_skips(tmp_path, artifacts, head):  # noqa: F811
    with pytest.raises(AirflowSkipException, match="Nothing to save"):
        operator(tmp_path / "never-created").execute(context())


def test_a_failed_copy_fails_this_task_only(tmp_path, head, monkeypatch):  # noqa: F811
    """A real failed PUT (nothing listens at the endpoint) surfaces as this task's error; the DAG's
    delete_cluster, a teardown after it, runs anyway."""
    import json

    monkeypatch.setenv("AIRFLOW_CONN_UC_DEAD_AWS", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": "http://127.0.0.1:1", "region_name": "us-east-1"}}))
    op = operator(failed_job_dir(tmp_path))
    op.aws_conn_id = "uc_dead_aws"
    with pytest.raises(Exception, match="Failed to connect to 127.0.0.1 port 1"):  # curl's own error
        op.execute(context())


@pytest.mark.parametrize("uri", ["ultracluster-artifacts", "https://x/y", ""])
def test_bad_artifacts_uri(tmp_path, head, uri):  # noqa: F811
    op = SaveFailureArtifactsOperator(task_id="s", head_node=HEAD, job_dir=str(tmp_path), artifacts_s3_uri=uri)
    with pytest.raises(ValueError, match="artifacts_s3_uri"):
        op.execute(context())
    assert head.commands == []
