"""Where a run's compile cache is kept between runs: its key and its S3 object (docs/operations.md).

The key names what determines the compiled graphs: model size, micro-batch, sequence length,
processes per node and the compiler (the pinned neuronx-cc of include/neuron-versions.env, and the
training python that runs it). Runs that share those reuse one archive; anything else starts cold.
"""
from __future__ import annotations

import hashlib
import json
import re

from ultracluster.run.neuron_versions import load_versions, pip_specs
from ultracluster.run.s3 import join_key, split_s3_uri

SEQUENCE_LENGTH = 128  # the run script's (run_dp_bert_large_hf_pretrain_bf16_s128.sh)
_SLUG = re.compile(r"[^a-z0-9.]+")


def cache_facts(*, model_size: str, micro_batch: int | str, procs_per_node: int | str | None,
                instance_type: str, compiler: str, training_python: str) -> dict[str, str]:
    """What the key is made of. Without NPROC_PER_NODE the job takes the node's devices, so the
    instance type stands for it."""
    return {
        "model_size": str(model_size),
        "micro_batch": str(int(micro_batch)),
        "sequence_length": str(SEQUENCE_LENGTH),
        "procs_per_node": str(procs_per_node) if procs_per_node not in (None, "") else f"devices of {instance_type}",
        "compiler": compiler,
        "training_python": training_python,
    }


def cache_key(facts: dict[str, str]) -> str:
    """Readable and unique: ``bert-large-mb16-s128-<16 hex of every fact>``."""
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    model = _SLUG.sub("-", facts["model_size"].lower()).strip("-")
    return f"bert-{model}-mb{facts['micro_batch']}-s{facts['sequence_length']}-{digest}"


def cache_object(compile_cache_s3_uri: str, key: str) -> tuple[str, str]:
    """Bucket and object key of the archive: ``<prefix>/<key>.tar``."""
    bucket, prefix = split_s3_uri(compile_cache_s3_uri)
    return bucket, join_key(prefix, f"{key}.tar")


def compiler_version() -> str:
    """The pinned compiler, from the one versions file."""
    specs = [spec for spec in pip_specs(load_versions()) if spec.startswith("neuronx-cc==")]
    return specs[0] if specs else "neuronx-cc (unpinned)"
