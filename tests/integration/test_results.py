"""collect_results: metrics from a blog-era results.json, artifact selection, and the upload path
end to end (presigned PUT URLs from S3Hook, curl run by a local bash, a real moto S3 server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException

from tests.head_node_patch import use_head_node
from tests.integration.test_dataset import LocalShellHeadNode, stop_leftover_transfers, empty_bucket  # noqa: F401
from ultracluster.operators.results import CollectResultsOperator, summary_table
from ultracluster.run.contracts import extract_metrics, select_artifacts
from ultracluster.run.names import safe_run_id

HEAD = {"cluster_name": "c1", "address": "127.100.1.1", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"}


def metric(name, value, units):
    return {"MetricName": name, "MeasuredValue": value, "Units": units, "Timestamp": "2026-11-30T09:00:00Z",
            "AdditionalData": ""}


# The blog-era schema written by dp_bert_large_hf_pretrain_hdf5.py (--metrics_file).
RESULTS = {
    "results": {
        "parameters": {
            "Model": "bert-large-uncased", "Model configuration": "BertForPreTraining", "World size": 64,
            "Data parallel degree": 64, "Batch size": 16, "Total steps": 40, "Seed": 12349, "Optimizer": "AdamW",
            "Data type": "bf16", "Gradient accumulation microsteps": 16, "Warmup steps": 2000,
            "Shards per checkpoint": 1, "Dataset": "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128",
            "Environment variables": {"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}, "Sequence length": 128,
        },
        "metrics": [
            metric("Loss", 10.5, "-"), metric("Throughput", 3100.0, "seq/s"),
            metric("Loss", 9.25, "-"), metric("Throughput", 3365.5, "seq/s"),
            metric("Final loss", 9.1, "-"), metric("Time to train", 12.5, "minutes"),
            metric("Average throughput", 3232.75, "seq/s"), metric("Peak throughput", 3365.5, "seq/s"),
        ],
    }
}


def test_extract_metrics_from_final_values():
    metrics = extract_metrics(RESULTS, num_nodes=2, scaling_mode="strong")
    assert metrics["final_loss"] == 9.1
    assert metrics["average_throughput_seq_per_s"] == 3232.75
    assert metrics["peak_throughput_seq_per_s"] == 3365.5
    assert metrics["time_to_train_min"] == 12.5
    assert metrics["global_batch"] == 64 * 16 * 16
    assert (metrics["nodes"], metrics["scaling_mode"], metrics["world_size"], metrics["total_steps"]) == (2, "strong", 64, 40)


def test_extract_metrics_falls_back_to_running_values():
    running = {"results": {"parameters": {"Scaling mode": "weak", "Nodes": 4},
                           "metrics": [metric("Loss", 3.0, "-"), metric("Throughput", 10.0, "seq/s"),
                                       metric("Loss", 2.0, "-"), metric("Throughput", 30.0, "seq/s")]}}
    metrics = extract_metrics(running)
    assert metrics["final_loss"] == 2.0 and metrics["average_throughput_seq_per_s"] == 20.0
    assert metrics["peak_throughput_seq_per_s"] == 30.0 and metrics["time_to_train_min"] is None
    assert metrics["nodes"] == 4 and metrics["scaling_mode"] == "weak" and metrics["global_batch"] is None


@pytest.mark.parametrize("bad", [{}, {"results": {}}, {"results": {"metrics": "x"}}, {"metrics": []}])
def test_extract_metrics_rejects_other_shapes(bad):
    with pytest.raises(ValueError, match="blog-era"):
        extract_metrics(bad)


def test_select_artifacts_keeps_results_logs_and_newest_checkpoint():
    files = {
        "results.json": 100, "log_ph1_bf16_0_2": 10, "log_ph1_bf16_1_2": 10, "ckpt_20.pt": 5, "ckpt_40.pt": 5,
        "events.out.tfevents.1": 3, "scratch/tmp.txt": 1,
    }
    assert select_artifacts(files) == ["ckpt_40.pt", "log_ph1_bf16_0_2", "log_ph1_bf16_1_2", "results.json"]
    # the training program's layout: checkpoints/ckpt_<step>.pt, written through a hidden temp file
    training = {"results.json": 1, "log_ph1_bf16_0_1": 1, "checkpoints/ckpt_30.pt": 1, "checkpoints/ckpt_40.pt": 1,
                "checkpoints/.ckpt_50.pt.tmp": 1}
    assert select_artifacts(training) == ["checkpoints/ckpt_40.pt", "log_ph1_bf16_0_1", "results.json"]


def test_select_artifacts_of_a_128_node_run_with_many_checkpoints():
    """Every node's log, results.json and only the newest of 100 checkpoints."""
    files = {f"log_ph1_bf16_{rank}_128": 10 for rank in range(128)}
    files.update({f"checkpoints/ckpt_{step}.pt": 5 for step in range(10, 1010, 10)})
    files.update({"results.json": 1, "events.out.tfevents.1": 3, "checkpoints/.ckpt_1010.pt.tmp": 1})
    chosen = select_artifacts(files)
    assert chosen == sorted(chosen) and len(chosen) == len(set(chosen)) == 1 + 128 + 1
    assert {p for p in chosen if p.startswith("log_")} == {f"log_ph1_bf16_{rank}_128" for rank in range(128)}
    assert [p for p in chosen if p.startswith("checkpoints/")] == ["checkpoints/ckpt_1000.pt"]
    assert "results.json" in chosen and "events.out.tfevents.1" not in chosen


def test_summary_table_is_readable():
    table = summary_table(extract_metrics(RESULTS, num_nodes=2, scaling_mode="strong"))
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1  # aligned
    assert any("Final loss" in line and "9.1000" in line for line in lines)
    assert any("Scaling mode" in line and "strong" in line for line in lines)


@pytest.fixture
def artifacts(moto_server, monkeypatch):
    moto_endpoint = moto_server
    import boto3

    monkeypatch.setenv("AIRFLOW_CONN_UC_TEST_AWS", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"},
    }))
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    empty_bucket(client, "ultracluster-artifacts")  # the session's moto server is shared: no global reset
    return client


@pytest.fixture
def head(monkeypatch):
    shell = LocalShellHeadNode()
    use_head_node(monkeypatch, shell)
    return shell


class OutletEvents(dict):
    def __missing__(self, key):
        self[key] = SimpleNamespace(extra={})
        return self[key]


def job_outputs(tmp_path):
    job_dir = tmp_path / "fsx" / "jobs" / "train"
    output = job_dir / "output_7"
    (output / "ckpt").mkdir(parents=True)
    (output / "results.json").write_text(json.dumps(RESULTS))
    for rank in range(2):
        (output / f"log_ph1_bf16_{rank}_2").write_text(f"rank {rank}\n")
    (output / "ckpt" / "ckpt_20.pt").write_bytes(b"old")
    (output / "ckpt" / "ckpt_40.pt").write_bytes(b"final checkpoint")
    (job_dir / "slurm-7.out").write_text("UC_PROGRESS step=40 total=40 loss=9.1\n")
    return {"job_id": "7", "state": "COMPLETED", "exit_code": 0, "output_dir": str(output),
            "log_path": str(job_dir / "slurm-7.out"), "results_path": str(output / "results.json")}


def test_collect_uploads_and_reports(tmp_path, artifacts, head, capsys):
    from airflow.sdk import Asset

    asset = Asset("s3://ultracluster-artifacts/results")
    op = CollectResultsOperator(
        task_id="collect_results", head_node=HEAD, train=job_outputs(tmp_path),
        artifacts_s3_uri="s3://ultracluster-artifacts", aws_conn_id="uc_test_aws", num_nodes=2,
        scaling_mode="strong", outlets=[asset],
    )
    events = OutletEvents()
    pushed = {}
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id="manual__2026-11-30T08:00:00+00:00", task_id="collect_results",
                         xcom_push=lambda key, value: pushed.__setitem__(key, value))
    metrics = op.execute({"ti": ti, "outlet_events": events})

    # The run's slug, as the cluster config's prefix uses it.
    prefix = f"results/trn1_bert_pretrain/{safe_run_id('manual__2026-11-30T08:00:00+00:00')}/"
    assert prefix.startswith("results/trn1_bert_pretrain/manual-2026-11-30t08-00-00-00-00-")
    keys = sorted(o["Key"] for o in artifacts.list_objects_v2(Bucket="ultracluster-artifacts")["Contents"])
    assert keys == [prefix + name for name in
                    ["ckpt/ckpt_40.pt", "log_ph1_bf16_0_2", "log_ph1_bf16_1_2", "results.json", "slurm-7.out"]]
    body = artifacts.get_object(Bucket="ultracluster-artifacts", Key=prefix + "ckpt/ckpt_40.pt")["Body"].read()
    assert body == b"final checkpoint"
    assert metrics["final_loss"] == 9.1 and metrics["nodes"] == 2 and metrics["job_id"] == "7"
    assert metrics["artifacts_uri"] == f"s3://ultracluster-artifacts/{prefix}"
    assert events[asset].extra["final_loss"] == 9.1
    # The "Results (S3)" extra link points at the prefix this task filled.
    from ultracluster.links import S3ResultsLink, SweepReportLink
    link = S3ResultsLink().format_link(**pushed[S3ResultsLink.key])
    assert link == ("https://s3.console.aws.amazon.com/s3/buckets/ultracluster-artifacts?region=us-east-1"
                    f"&prefix={prefix}")
    assert SweepReportLink.key not in pushed  # not a sweep run: no report to link to
    out = capsys.readouterr().out
    assert "Final loss" in out and "Signature=" not in out
    assert all("Signature=" not in c.shell for c in head.commands)
    json.dumps(metrics)


def test_a_sweep_run_links_its_report_and_a_failed_upload_still_links_the_folder(tmp_path, artifacts, head,
                                                                               monkeypatch):
    from ultracluster.links import S3ResultsLink, SweepReportLink

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://127.0.0.1:8080")
    train = job_outputs(tmp_path)
    sweep = {"id": "s1", "index": 1, "count": 3, "points": [1, 2, 4], "num_nodes": 2, "scaling_mode": "weak",
             "chosen_by": "point"}
    results = json.loads(json.dumps(RESULTS))
    results["results"]["parameters"]["Sweep"] = sweep
    (tmp_path / "fsx" / "jobs" / "train" / "output_7" / "results.json").write_text(json.dumps(results))
    op = CollectResultsOperator(task_id="collect_results", head_node=HEAD, train=train,
                                artifacts_s3_uri="s3://ultracluster-artifacts", aws_conn_id="uc_test_aws")
    pushed = {}
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id="manual__2026-11-30T08:00:00+00:00",
                         task_id="collect_results", xcom_push=lambda key, value: pushed.__setitem__(key, value))
    monkeypatch.setattr(CollectResultsOperator, "_upload", lambda *a, **k: (_ for _ in ()).throw(
        AirflowException("upload failed")))
    with pytest.raises(AirflowException, match="upload failed"):
        op.execute({"ti": ti, "outlet_events": OutletEvents()})
    assert pushed[SweepReportLink.key] == {"dag_id": "trn1_bert_pretrain", "sweep_id": "s1"}
    assert SweepReportLink().format_link(**pushed[SweepReportLink.key]) == (
        "http://127.0.0.1:8080/ultracluster/reports/trn1_bert_pretrain/s1")
    assert pushed[S3ResultsLink.key]["prefix"].startswith("results/trn1_bert_pretrain/manual-2026-11-30t08")


def test_retry_stops_the_earlier_tries_upload_first(tmp_path, artifacts, head):
    """A worker died mid-upload: its curl still runs. The retry stops it before uploading again."""
    from tests.integration.test_dataset import start_blocked_download

    train = job_outputs(tmp_path)
    pid_file = f"{train['output_dir']}/.ultracluster-upload.pid"
    orphan = start_blocked_download(tmp_path, pid_file)
    op = CollectResultsOperator(task_id="c", head_node=HEAD, train=train, artifacts_s3_uri="s3://ultracluster-artifacts",
                                aws_conn_id="uc_test_aws")
    op.execute({"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="c", xcom_push=lambda **_: None),
                "outlet_events": OutletEvents()})
    assert orphan.wait(timeout=10) != 0
    descriptions = [c.description for c in head.commands]
    stop = descriptions.index(f"stop the process group in {pid_file}")
    assert stop < next(i for i, d in enumerate(descriptions) if "(cancellable)" in d)


def test_missing_results_json_fails(tmp_path, artifacts, head):
    train = job_outputs(tmp_path)
    train["results_path"] = str(tmp_path / "nope.json")
    op = CollectResultsOperator(task_id="c", head_node=HEAD, train=train, artifacts_s3_uri="s3://ultracluster-artifacts",
                                aws_conn_id="uc_test_aws")
    with pytest.raises(AirflowException, match="missing or empty"):
        op.execute({"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="c"), "outlet_events": OutletEvents()})


@pytest.mark.parametrize("uri", ["ultracluster-artifacts", "https://x/y", ""])
def test_bad_artifacts_uri(tmp_path, head, uri):
    op = CollectResultsOperator(task_id="c", head_node=HEAD, train=job_outputs(tmp_path), artifacts_s3_uri=uri)
    with pytest.raises(ValueError, match="artifacts_s3_uri"):
        op.execute({"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="c"), "outlet_events": OutletEvents()})
    assert head.commands == []


def test_collect_of_a_128_node_run_takes_every_log_in_one_command_one_presign_client_and_one_listing(
        tmp_path, artifacts, head, monkeypatch):
    """At scale: every node's log reaches S3 through one curl command on the head node, the presigned
    URLs come from one botocore client and the upload is checked with one listing, not a HEAD per file."""
    from botocore.endpoint import Endpoint

    from ultracluster.hooks.artifacts import ArtifactsS3Hook

    nodes = 128
    train = job_outputs(tmp_path)
    output = tmp_path / "fsx" / "jobs" / "train" / "output_7"
    for rank in range(nodes):
        (output / f"log_ph1_bf16_{rank}_{nodes}").write_text(f"rank {rank}\n")
    clients, operations = [], []
    real_client, real_request = ArtifactsS3Hook.get_client_type, Endpoint.make_request
    monkeypatch.setattr(ArtifactsS3Hook, "get_client_type",
                        lambda self, *a, **k: clients.append(k) or real_client(self, *a, **k))
    monkeypatch.setattr(Endpoint, "make_request",
                        lambda self, model, request: operations.append(model.name) or real_request(self, model, request))
    op = CollectResultsOperator(task_id="collect_results", head_node=HEAD, train=train,
                                artifacts_s3_uri="s3://ultracluster-artifacts", aws_conn_id="uc_test_aws",
                                num_nodes=nodes)
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id="manual__scale", task_id="collect_results",
                         xcom_push=lambda **_: None)
    metrics = op.execute({"ti": ti, "outlet_events": OutletEvents()})
    requests = list(operations)  # the operator's requests, not the check's below

    prefix = metrics["artifacts_uri"].removeprefix("s3://ultracluster-artifacts/")
    keys = set()
    for page in artifacts.get_paginator("list_objects_v2").paginate(Bucket="ultracluster-artifacts", Prefix=prefix):
        keys |= {o["Key"].removeprefix(prefix) for o in page.get("Contents", [])}
    assert {f"log_ph1_bf16_{rank}_{nodes}" for rank in range(nodes)} <= keys
    assert {"results.json", "ckpt/ckpt_40.pt", "slurm-7.out", "log_ph1_bf16_0_2"} <= keys
    uploads = [c for c in head.commands if c.description.startswith("upload ")]
    assert len(uploads) == 1 and "upload 133 file(s)" in uploads[0].description, [str(c) for c in head.commands]
    # The hook's own client (the listing) and the SigV4 presigning one, built once for 133 URLs.
    assert len(clients) == 2 and sum("config" in kwargs for kwargs in clients) == 1, clients
    assert "HeadObject" not in requests and requests.count("ListObjectsV2") == 1, requests
