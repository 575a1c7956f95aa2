"""restore_compile_cache / save_compile_cache against a real moto S3 server, with the real built
commands run by a local bash standing in for the head node (tar, curl with presigned URLs)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.integration.test_dataset import aws_conn, empty_bucket, head, moto_endpoint  # noqa: F401 - fixtures
from ultracluster.operators.compile_cache import CompileCacheOperator
from ultracluster.run.compile_cache import cache_facts, cache_key, cache_object, compiler_version

CACHE_URI = "s3://uc-compile-cache/neuron"
HEAD = {"cluster_name": "c1", "address": "127.100.1.1", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"}
FACTS = {"model_size": "large", "micro_batch": "16", "procs_per_node": "", "instance_type": "trn1.32xlarge",
         "training_python": "/opt/aws_neuron_venv_pytorch/bin/python"}
CTX = {"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1)}


def operator(action: str, cache_dir, uri: str | None = CACHE_URI, facts: dict = FACTS) -> CompileCacheOperator:
    return CompileCacheOperator(task_id=f"{action}_compile_cache", action=action, head_node=HEAD,
                                compile_cache_s3_uri=uri, cache_dir=str(cache_dir), cache_facts=facts,
                                aws_conn_id="uc_test_aws")


def key_of(**changes) -> str:
    return cache_key(cache_facts(**{"compiler": compiler_version(), **FACTS, **changes}))


def test_the_key_changes_with_each_fact_that_shapes_the_graphs():
    base = key_of()
    assert base == key_of() and base.startswith("bert-large-mb16-s128-")
    changed = {key_of(model_size="tiny"), key_of(micro_batch="8"), key_of(procs_per_node="16"),
               key_of(instance_type="trn1.2xlarge"), key_of(compiler="neuronx-cc==2.99.0.0")}
    assert base not in changed and len(changed) == 5
    assert compiler_version().startswith("neuronx-cc==2.")  # from include/neuron-versions.env


def test_a_cache_saved_by_one_cluster_is_restored_on_the_next(tmp_path, aws_conn, head, capsys):  # noqa: F811
    empty_bucket(aws_conn, "uc-compile-cache")
    first = tmp_path / "cluster-1" / "fsx" / "neuron-compile-cache"
    (first / "neuronxcc-2.23" / "MODULE_1").mkdir(parents=True)
    (first / "neuronxcc-2.23" / "MODULE_1" / "model.neff").write_bytes(b"\x00neff" * 1000)
    (first / "inductor").mkdir()
    (first / "inductor" / "graph.py").write_text("compiled")

    cold = operator("restore", first).execute(CTX)
    assert cold["restored"] is False and cold["enabled"] is True
    saved = operator("save", first).execute(CTX)
    bucket, key = cache_object(CACHE_URI, key_of())
    assert saved == {"enabled": True, "key": key_of(), "s3_uri": f"s3://{bucket}/{key}", "saved": True,
                     "bytes": aws_conn.head_object(Bucket=bucket, Key=key)["ContentLength"]}

    second = tmp_path / "cluster-2" / "fsx" / "neuron-compile-cache"
    warm = operator("restore", second).execute(CTX)
    assert warm["restored"] is True and warm["bytes"] == saved["bytes"]
    assert (second / "neuronxcc-2.23" / "MODULE_1" / "model.neff").read_bytes() == b"\x00neff" * 1000
    assert (second / "inductor" / "graph.py").read_text() == "compiled"
    assert not list(second.parent.glob(".ultracluster-cache-*"))  # the archive is not left behind
    # Another key (another micro-batch) starts cold.
    other = operator("restore", tmp_path / "cluster-3", facts={**FACTS, "micro_batch": "8"}).execute(CTX)
    assert other["restored"] is False
    # The presigned URLs (secrets) travel on stdin only.
    assert all("Signature=" not in c.shell and "Signature=" not in str(c) for c in head.commands)
    assert "Signature=" not in capsys.readouterr().out + json.dumps([cold, saved, warm])


def test_without_a_cache_uri_nothing_is_touched(tmp_path, head):  # noqa: F811
    for action in ("restore", "save"):
        assert operator(action, tmp_path / "cache", uri=None).execute(CTX) == {"enabled": False}
    assert head.commands == []


def test_a_relative_cache_dir_is_refused(tmp_path, head):  # noqa: F811
    with pytest.raises(ValueError, match="absolute"):
        operator("restore", "relative/cache").execute(CTX)
