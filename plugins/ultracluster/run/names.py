"""Names derived from a run: its slug, cluster, network stack, Slurm jobs and S3 locations.

Deterministic, so a retry finds what an earlier try made; hashed, so two runs whose ids read alike
never share a name.
"""
from __future__ import annotations

import hashlib
import re

from ultracluster.run import form
from ultracluster.run.errors import ConfigValidationError
from ultracluster.run.s3 import join_key, split_s3_uri

CLUSTER_NAME_PATTERN = re.compile(form.CLUSTER_NAME_PATTERN)
JOB_NAME_MAX = 120
_JOB_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

def safe_run_id(run_id: str) -> str:
    """A run id usable in paths and resource names: [a-z0-9-], plus a hash so distinct ids stay distinct."""
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-") or "run"
    return f"{slug[:48].rstrip('-')}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"

def cluster_name_for(run_id: str, requested: str | None = None) -> str:
    """The requested cluster name, else one derived from the run id (valid for pcluster, <= 40 chars)."""
    if requested:
        if not CLUSTER_NAME_PATTERN.match(requested):
            raise ConfigValidationError(
                f"cluster_name {requested!r}: must start with a letter, hold only letters, digits and "
                "hyphens, at most 40 characters"
            )
        return requested
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")[:27].rstrip("-") or "run"
    return f"uc-{slug}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"

def vpc_stack_name_for(run_id: str) -> str:
    return f"uc-vpc-{safe_run_id(run_id)}"

def compute_resource_name(instance_type: str) -> str:
    """trn1.32xlarge -> trn1-32xl (ComputeResources Name: short, no dots)."""
    return instance_type.replace("xlarge", "xl").replace(".", "-")

def slurm_job_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1, label: str | None = None) -> str:
    """Deterministic, shell- and Slurm-safe job name for one task of one run.

    The readable part is sanitised and cut; the hash of the exact ids keeps two runs (or two
    tasks) whose ids sanitise to the same text apart, so reattach never picks another run's job.
    """
    identity = f"{dag_id}\x1f{run_id}\x1f{task_id}\x1f{map_index}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    readable = _JOB_NAME_UNSAFE.sub("_", label or f"{dag_id}.{task_id}").strip("._-") or "task"
    readable = readable[: JOB_NAME_MAX - len(digest) - 4]
    return f"uc.{readable}.{digest}"

def run_artifacts_location(artifacts_s3_uri: str, dag_id: str, run_id: str, *kind: str) -> tuple[str, str]:
    """Bucket and prefix of one run's artifacts: ``<prefix>[/<kind>]/<dag_id>/<safe run id>``."""
    bucket, prefix = split_s3_uri(artifacts_s3_uri)
    return bucket, join_key(prefix, *kind, dag_id, safe_run_id(run_id))
