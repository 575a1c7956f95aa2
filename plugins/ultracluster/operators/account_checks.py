"""preflight's account checks: what AWS can tell before anything is created (docs/operations.md,
"Preflight checks and failure surfaces").

Each problem is one line naming its param; the caller fails the run once with all of them.
Deterministic answers (a missing object, bucket or key pair, an access denial, an instance type not
offered, a quota too small) are problems; an access denial (HTTP 403) is told apart from a missing
bucket or object (404; ``run.s3_access``). Transient ones (throttling, an unreachable endpoint)
propagate, so the task retries. The dataset is read as download_data reads it (``dataset_anonymous``:
unsigned), its ``.sha256`` sidecar included.
"""
from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from ultracluster.hooks.account import TRN_VCPU_QUOTA_CODE, AccountHook
from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.dataset import DatasetS3Hook
from ultracluster.operators.capacity_checks import capacity_problems
from ultracluster.operators.checkpoint import ResumeFromError, resolve_checkpoint
from ultracluster.operators.dataset import dataset_object, read_sidecar
from ultracluster.run import capacity as run_capacity
from ultracluster.run import s3_access
from ultracluster.run.errors import aws_error_code, is_transient
from ultracluster.run.existing_cluster import existing_cluster
from ultracluster.run.s3 import split_s3_uri


def account_problems(plan: dict[str, Any], aws_conn_id: str | None, probe_name: str, prices: dict[str, Any],
                     log: Any, sse: Mapping[str, str] | None = None, warnings: list[str] | None = None,
                     capacity: dict[str, Any] | None = None) -> list[str]:
    """Every problem AWS reports with the plan's S3 locations, key pair, instance types, quota and capacity.
    ``probe_name``: a file name unique to the run, written (with ``sse``, the deployment's encryption,
    so a KMS key the role cannot use shows here) and deleted to prove write access. ``warnings``, when
    given, gets what is worth a look but no failure (an unreadable checksum sidecar). ``capacity``:
    ``capacity_checks.capacity_problems``' keyword arguments (None: capacity not checked). A run on an
    existing cluster launches nothing itself: its key pair, instance offerings, quota and capacity are
    the cluster's (preflight checks the cluster instead)."""
    s3 = ArtifactsS3Hook(aws_conn_id=aws_conn_id, sse=sse)
    dataset = DatasetS3Hook(aws_conn_id=aws_conn_id, anonymous=plan.get("dataset_anonymous") is True)
    ec2 = AccountHook(aws_conn_id=aws_conn_id, region_name=plan.get("region") or None)
    if s3.get_session().get_credentials() is None:  # before any request: an unsigned one would go out
        return [f"AWS connection {aws_conn_id!r}: no AWS credentials found; nothing in the account could be checked"]
    def buckets() -> list[str]:
        problems = unreadable(dataset, "dataset_s3_uri", plan.get("dataset_s3_uri"), warnings)
        problems += unwritable(s3, "artifacts_s3_uri", plan.get("artifacts_s3_uri"), probe_name)
        if plan.get("compile_cache_s3_uri"):
            problems += unwritable(s3, "compile_cache_s3_uri", plan["compile_cache_s3_uri"], probe_name)
        return problems + _resumable(s3, plan.get("resume_from"))

    def launch() -> list[str]:  # what launching the run's own cluster needs
        problems = _key_pair(ec2, plan.get("key_name")) + _offerings(ec2, plan) + _trn_quota(ec2, plan, prices, log)
        return problems + (capacity_problems(ec2, plan, **capacity) if capacity is not None else [])

    try:
        if existing_cluster(plan):
            return buckets()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight-ec2") as pool:  # S3 and EC2 at once
            ec2_problems = pool.submit(launch)
            return buckets() + ec2_problems.result()
    except (NoCredentialsError, PartialCredentialsError) as err:   # a deployment's setup, not a blip
        return [f"AWS connection {aws_conn_id!r}: {err}; nothing in the account could be checked"]


def unreadable(s3: DatasetS3Hook, param: str, uri: str | None, warnings: list[str] | None = None) -> list[str]:
    """The object's HEAD, then its checksum sidecar: what download_data reads before downloading.
    HeadObject answers a bare 404 for a missing bucket and a missing key alike; HeadBucket tells them
    apart. A bucket the caller may not list (a public one) answers HeadBucket 403: never asked first."""
    try:
        bucket, key = dataset_object(uri or "")
    except ValueError as err:
        return [f"{param}: {err}"]
    try:
        s3.head(bucket, key)
    except ClientError as err:
        if is_transient(err):
            raise
        return [f"{param}: {_read_problem(s3, err, bucket, key)}"]
    try:
        _digest, note = read_sidecar(s3, bucket, key)
    except ValueError as err:   # a sidecar without a digest: download_data would fail on it
        return [f"{param}: {err}"]
    except ClientError as err:
        if is_transient(err):
            raise
        return [f"{param}: s3://{bucket}/{s3_access.sidecar_key(key)} is not readable: {aws_error_code(err) or err}"]
    if note and warnings is not None:
        warnings.append(f"{param}: {note}")
    return []


def _read_problem(s3: DatasetS3Hook, err: ClientError, bucket: str, key: str) -> str:
    found = s3_access.verdict(err)
    if found == s3_access.DENIED:
        return s3_access.denied_message(f"s3://{bucket}/{key}", anonymous=s3.anonymous)
    if found == s3_access.MISSING:
        return s3_access.missing_message(bucket, key, bucket_missing=_bucket_verdict(s3, bucket) == s3_access.MISSING)
    return f"s3://{bucket}/{key} is not readable: {aws_error_code(err) or err}"


def _bucket_verdict(s3: Any, bucket: str) -> str | None:
    """HeadBucket's answer: None (there and visible), or ``s3_access.verdict`` of its error."""
    try:
        s3.get_conn().head_bucket(Bucket=bucket)
    except ClientError as err:
        if is_transient(err):
            raise
        return s3_access.verdict(err)
    return None


def unwritable(s3: Any, param: str, uri: str | None, probe_name: str) -> list[str]:
    try:
        bucket, prefix = split_s3_uri(uri or "")
    except ValueError as err:
        return [f"{param}: {err}"]
    key = "/".join(p for p in (prefix.strip("/"), "_preflight", probe_name) if p)
    try:
        found = _bucket_verdict(s3, bucket)
        if found == s3_access.MISSING:
            return [f"{param}: {s3_access.missing_message(bucket, bucket_missing=True)}"]
        if found == s3_access.DENIED:
            return [(f"{param}: bucket {bucket}: access denied (HTTP 403): the bucket exists, but these "
                     "credentials may not use it (the pipeline writes here: it must be the deployment's own)")]
        s3.load_string("preflight write check", key, bucket, replace=True)
        s3.delete_objects(bucket, [key])
    except ClientError as err:
        if is_transient(err):
            raise
        return [f"{param}: cannot write to s3://{bucket}/{prefix}: {aws_error_code(err) or err}"]
    return []


# GetPublicAccessBlock's four flags: all true blocks every kind of public access.
PUBLIC_ACCESS_FLAGS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


def public_access_warnings(plan: dict[str, Any], aws_conn_id: str | None) -> list[str]:
    """A line per bucket the run writes to that does not block public access (no configuration, or a
    flag off). Warnings, not problems: the bucket's owner may mean it, and an account-level block may
    cover it. A bucket that does not exist is left to ``account_problems``."""
    client = S3Hook(aws_conn_id=aws_conn_id).get_conn()
    buckets: dict[str, str] = {}
    for param in ("artifacts_s3_uri", "compile_cache_s3_uri"):
        try:
            buckets.setdefault(split_s3_uri(plan.get(param) or "")[0], param)
        except ValueError:
            continue
    warnings = []
    for bucket, param in buckets.items():
        try:
            config = client.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
        except ClientError as err:
            if is_transient(err):
                raise
            if aws_error_code(err) == "NoSuchPublicAccessBlockConfiguration":
                warnings.append(f"{param}: bucket {bucket} has no public access block (S3 Block Public Access "
                                "is not configured on it)")
            elif aws_error_code(err) != "NoSuchBucket":
                warnings.append(f"{param}: could not read the public access block of bucket {bucket}: {aws_error_code(err)}")
            continue
        off = [flag for flag in PUBLIC_ACCESS_FLAGS if not config.get(flag)]
        if off:
            warnings.append(f"{param}: bucket {bucket} does not block all public access ({', '.join(off)} off)")
    return warnings


def _key_pair(ec2: Any, key_name: str | None) -> list[str]:
    if not key_name:
        return ["key_name: empty; the head node needs an EC2 key pair"]
    try:
        ec2.describe_key_pairs(key_name)
    except ClientError as err:
        if is_transient(err):
            raise
        if aws_error_code(err) == "InvalidKeyPair.NotFound":
            return [f"key_name: no key pair {key_name!r} in {ec2.region_name}"]
        return [f"key_name: cannot read key pair {key_name!r}: {aws_error_code(err) or err}"]
    return []


def _offerings(ec2: Any, plan: dict[str, Any]) -> list[str]:
    zone = plan.get("availability_zone_id")
    wanted = {"instance_type": plan.get("instance_type"), "head_node_instance_type": plan.get("head_node_instance_type")}
    for queue in plan.get("extra_queues") or []:
        if isinstance(queue, dict) and queue.get("instance_type"):
            wanted[f"extra_queues[{queue.get('name')}].instance_type"] = queue["instance_type"]
    types = sorted({t for t in wanted.values() if t})
    if not zone or not types:
        return []
    try:
        offered = set(ec2.describe_instance_type_offerings(zone, types))
    except ClientError as err:
        if is_transient(err):
            raise
        return [f"availability_zone_id: cannot list instance type offerings in {zone}: {aws_error_code(err) or err}"]
    return [f"{param}: {itype} is not offered in availability zone id {zone} (pick another AZ id or type)"
            for param, itype in wanted.items() if itype and itype not in offered]


def _trn_quota(ec2: Any, plan: dict[str, Any], prices: dict[str, Any], log: Any) -> list[str]:
    """The account's Running On-Demand Trn instances quota (vCPUs) against max_nodes."""
    itype = str(plan.get("instance_type") or "")
    vcpus = (prices.get("instances", {}).get(itype) or {}).get("vcpus")
    if not itype.startswith("trn") or not vcpus or not isinstance(plan.get("max_nodes"), int):
        return []
    if run_capacity.capacity_type(plan) == run_capacity.SPOT:
        log.info("Trn vCPU quota not checked: %s is On-Demand's; Spot instances have quotas of their own",
                 TRN_VCPU_QUOTA_CODE)
        return []
    needed = plan["max_nodes"] * int(vcpus)
    try:
        quota = ec2.get_service_quota("ec2", TRN_VCPU_QUOTA_CODE)
    except (ClientError, BotoCoreError) as err:
        log.warning("Trn vCPU quota not checked: Service Quotas did not answer (%s); max_nodes %d × %d vCPUs "
                    "needs %d", aws_error_code(err) or err, plan["max_nodes"], vcpus, needed)
        return []
    log.info("Trn vCPU quota %s: %.0f vCPUs; max_nodes %d × %d needs %d", TRN_VCPU_QUOTA_CODE, quota,
             plan["max_nodes"], vcpus, needed)
    if needed > quota:
        return [f"max_nodes: {plan['max_nodes']} × {itype} needs {needed} vCPUs, over the account's Running "
                f"On-Demand Trn instances quota of {quota:.0f} ({TRN_VCPU_QUOTA_CODE}); request an increase "
                "or lower max_nodes"]
    return []


def _resumable(s3: Any, uri: str | None) -> list[str]:
    """resume_from resolves to a checkpoint (or is unset)."""
    if not uri:
        return []
    try:
        resolve_checkpoint(s3, uri)
    except ResumeFromError as err:
        return [f"resume_from: {err}"]
    except ClientError as err:
        if is_transient(err):
            raise
        return [f"resume_from: {uri} is not readable: {aws_error_code(err) or err}"]
    return []
