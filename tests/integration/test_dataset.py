"""download_data end to end on this machine: a real moto S3 server (the localcluster venv's
moto_server on loopback), S3Hook presigned URLs, and the real built commands run by a local bash
standing in for the head node (curl, tar, sha256sum, the marker)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException

from tests.head_node_patch import use_head_node
from ultracluster import remote_commands as rc
from ultracluster.hooks.head_node import CommandResult, HeadNodeHook, HeadNodeUnreachableError
from ultracluster.operators.dataset import DownloadDatasetOperator, dataset_object, marker_matches

KEY = "training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar"
URI = f"s3://neuron-s3/{KEY}"
HEAD = {"cluster_name": "c1", "address": "127.100.1.1", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"}


@pytest.fixture
def moto_endpoint(moto_server):
    """The shared session moto server (tests/fixtures_localcluster.py: the localcluster venv's moto_server)."""
    return moto_server


def empty_bucket(client, bucket: str) -> None:
    if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=bucket)
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=item["Key"])


@pytest.fixture
def aws_conn(moto_endpoint, monkeypatch):
    import boto3

    monkeypatch.setenv("AIRFLOW_CONN_UC_TEST_AWS", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"},
    }))
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    empty_bucket(client, "neuron-s3")  # the session's moto server is shared: no global reset
    return client


class LocalShellHeadNode:
    """Runs the real RemoteCommand text in a local bash: what the head node would execute."""

    def __init__(self):
        self.commands = []

    def run(self, command, *, timeout=None):
        self.commands.append(command)
        done = subprocess.run(["bash", "-c", command.shell], input=command.stdin, capture_output=True, text=True, timeout=120)
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def check(self, command, *, timeout=None):
        result = self.run(command)
        if not result.ok:
            raise RuntimeError(f"`{command}` failed: {result.stderr}")
        return result

    def put_file(self, local, remote, *, mode=None):
        shutil.copy(local, remote)

    stop_remote_transfer = HeadNodeHook.stop_remote_transfer  # the real code, on this shell


@pytest.fixture
def head(monkeypatch):
    shell = LocalShellHeadNode()
    use_head_node(monkeypatch, shell)
    return shell


def make_tar(files: dict[str, bytes], manifest: bool = True, corrupt: str | None = None) -> bytes:
    top = "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
    members = dict(files)
    if manifest:
        lines = [f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in files.items()]
        members["SHA256SUMS"] = "".join(lines).encode()
    if corrupt:
        members[corrupt] = b"tampered"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


FILES = {f"wikicorpus_en_training_{i}.hdf5": os.urandom(2048) for i in range(3)}


def operator(tmp_path, **kwargs):
    params = dict(task_id="download_data", head_node=HEAD, dataset_s3_uri=URI, data_dir=str(tmp_path / "fsx" / "data"),
                  aws_conn_id="uc_test_aws", expected_min_files=3)
    params.update(kwargs)
    return DownloadDatasetOperator(**params)


CTX = {"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="download_data", map_index=-1)}


def test_download_unpack_verify_then_skip(tmp_path, aws_conn, head, capsys):
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES))
    result = operator(tmp_path).execute(CTX)
    data_dir = tmp_path / "fsx" / "data" / "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
    assert result == {"data_dir": str(data_dir), "files": 3, "skipped": False}
    assert sorted(p.name for p in data_dir.glob("*_training_*.hdf5")) == sorted(FILES)
    assert (data_dir / "wikicorpus_en_training_1.hdf5").read_bytes() == FILES["wikicorpus_en_training_1.hdf5"]
    assert not (tmp_path / "fsx" / "data" / "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar").exists()
    marker = json.loads(next((tmp_path / "fsx" / "data").glob(".ultracluster-dataset-*.json")).read_text())
    assert marker["source"] == URI and marker["files"] == 3 and marker["etag"]

    # the presigned URL (a secret) never appears in a command line, a log line or the result
    curl = [c for c in head.commands if "curl" in c.shell]
    assert len(curl) == 1 and "Signature=" in curl[0].stdin
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in curl[0].stdin   # Signature V4, which S3 requires (SSE-KMS)
    assert all("Signature=" not in c.shell and "Signature=" not in str(c) for c in head.commands)
    assert "Signature=" not in capsys.readouterr().out + json.dumps(result)

    head.commands.clear()
    again = operator(tmp_path).execute(CTX)
    assert again == {"data_dir": str(data_dir), "files": 3, "skipped": True}
    assert not any("curl" in c.shell for c in head.commands)


def test_changed_source_is_downloaded_again(tmp_path, aws_conn, head):
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES))
    operator(tmp_path).execute(CTX)
    more = {**FILES, "wikicorpus_en_training_3.hdf5": b"four"}
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(more))
    result = operator(tmp_path).execute(CTX)
    assert result["skipped"] is False and result["files"] == 4


def test_checksum_manifest_mismatch_fails(tmp_path, aws_conn, head):
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES, corrupt="wikicorpus_en_training_0.hdf5"))
    with pytest.raises(AirflowException, match="Checksum manifest check failed"):
        operator(tmp_path).execute(CTX)
    assert not list((tmp_path / "fsx" / "data").glob(".ultracluster-dataset-*.json"))  # no marker: a retry redoes it


def test_too_few_files_fails(tmp_path, aws_conn, head):
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES, manifest=False))
    with pytest.raises(AirflowException, match=r"holds 3 file.*expected at least 5"):
        operator(tmp_path, expected_min_files=5).execute(CTX)


def test_sha256_sidecar_is_checked(tmp_path, aws_conn, head):
    body = make_tar(FILES)
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=body)
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY + ".sha256", Body=b"0" * 64 + b"  x.tar\n")
    with pytest.raises(AirflowException, match="SHA-256"):
        operator(tmp_path).execute(CTX)
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY + ".sha256", Body=(hashlib.sha256(body).hexdigest() + "  x.tar\n").encode())
    assert operator(tmp_path).execute(CTX)["files"] == 3


def test_missing_object_is_a_clear_error(tmp_path, aws_conn, head):
    with pytest.raises(AirflowException, match="does not exist"):
        operator(tmp_path).execute(CTX)
    assert head.commands == []


@pytest.mark.parametrize("kwargs", [
    {"dataset_s3_uri": "https://neuron-s3/x.tar"}, {"dataset_s3_uri": "s3://neuron-s3/"},
    {"data_dir": "relative"}, {"expected_min_files": 0},
])
def test_bad_input_fails_before_anything(tmp_path, head, kwargs):
    with pytest.raises(ValueError):
        operator(tmp_path, **kwargs).execute(CTX)
    assert head.commands == []


def test_marker_matching():
    marker = json.dumps({"source": URI, "etag": "abc", "size": 10, "files": 3})
    assert marker_matches(marker, URI, "abc", 10)
    assert not marker_matches(marker, URI, "abd", 10)
    assert not marker_matches(marker, URI, "abc", 11)
    assert not marker_matches(marker, "s3://other/x.tar", "abc", 10)
    assert not marker_matches("", URI, "abc", 10) and not marker_matches("{bad", URI, "abc", 10)
    assert dataset_object(URI) == ("neuron-s3", KEY)


_STARTED: list[tuple[subprocess.Popen, int]] = []


@pytest.fixture(autouse=True)
def stop_leftover_transfers():
    """A failing test must not leave its blocked curl behind (killed by its own process group id)."""
    import signal

    yield
    while _STARTED:
        process, group = _STARTED.pop()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            process.wait(timeout=10)


def start_blocked_download(tmp_path, pid_file: str) -> subprocess.Popen:
    """A cancellable curl blocked on a FIFO nobody writes: a transfer that outlived its task try
    (setsid detached it from the lost SSH session)."""
    import time

    source = tmp_path / "slow-source"
    if not source.exists():
        os.mkfifo(source)
    os.makedirs(os.path.dirname(pid_file), exist_ok=True)
    command = rc.cancellable(rc.download_to_file(f"file://{source}", str(tmp_path / "fsx" / "data" / "x.tar")),
                             pid_file)
    process = subprocess.Popen(["bash", "-c", command.shell], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, text=True)
    process.stdin.write(command.stdin)
    process.stdin.close()
    for _ in range(600):  # up to 30 s: a loaded CI machine starts bash slowly
        if os.path.exists(pid_file) and open(pid_file).read().strip():
            break
        time.sleep(0.05)
    _STARTED.append((process, int(open(pid_file).read())))
    return process


def test_on_kill_stops_the_remote_download(tmp_path, head):
    """on_kill reaches the curl through the pid file the cancellable download recorded."""
    op = operator(tmp_path)
    op._pid_file = str(tmp_path / "fsx" / "data" / ".ultracluster-download.pid")
    process = start_blocked_download(tmp_path, op._pid_file)
    op.on_kill()
    assert process.wait(timeout=10) != 0
    assert [c.description for c in head.commands] == [f"stop the process group in {op._pid_file}"]


def test_retry_stops_the_earlier_tries_download_first(tmp_path, aws_conn, head):
    """A worker died mid-download: its curl still runs. The retry stops it before starting its own."""
    pid_file = str(tmp_path / "fsx" / "data" / ".ultracluster-download.pid")
    orphan = start_blocked_download(tmp_path, pid_file)
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES))
    assert operator(tmp_path).execute(CTX)["files"] == 3
    assert orphan.wait(timeout=10) != 0
    descriptions = [c.description for c in head.commands]
    stop = descriptions.index(f"stop the process group in {pid_file}")
    assert stop < next(i for i, d in enumerate(descriptions) if "(cancellable)" in d)


def test_lost_connection_during_download_stops_it(tmp_path, aws_conn, head, monkeypatch):
    """check raises (SSH lost) while the detached curl keeps going: the operator stops it."""
    source = tmp_path / "slow-source"
    os.mkfifo(source)
    monkeypatch.setattr(rc, "download_to_file",
                        lambda url, dest, _real=rc.download_to_file: _real(f"file://{source}", dest))
    started = []
    real_run = head.run

    def run(command, *, timeout=None):
        if "(cancellable)" not in command.description:
            return real_run(command, timeout=timeout)
        head.commands.append(command)
        started.append(start_blocked_download(tmp_path, str(tmp_path / "fsx" / "data" / ".ultracluster-download.pid")))
        raise HeadNodeUnreachableError("Lost head node: connection reset")

    monkeypatch.setattr(head, "run", run)
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES))
    with pytest.raises(HeadNodeUnreachableError):
        operator(tmp_path).execute(CTX)
    assert started and started[0].wait(timeout=10) != 0
