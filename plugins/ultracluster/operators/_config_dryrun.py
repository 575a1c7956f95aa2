"""render_config's last check: the rendered config through ``pcluster create-cluster --dryrun true``.

ParallelCluster's own validators (schema, subnets, instance types, key pair, AMI, the S3 objects the
config names, FSx, EFA, placement group) with nothing created. It needs the run's subnets, so it runs
in render_config, after create_vpc, not in preflight. A refused config fails the task at once
(AirflowFailException: the same config fails again on every retry), each validator message logged;
throttling or a failed AWS call raises the PclusterError itself, so the task retries.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ultracluster.hooks.parallelcluster import ParallelClusterHook


def dryrun_cluster_config(
    hook: ParallelClusterHook,
    cluster_name: str,
    config_text: str,
    *,
    suppress_validators: list[str] | None,
    log: logging.Logger,
) -> list[dict]:
    """Dry-run ``config_text``; returns pcluster's validationMessages (warnings, infos) when it passes."""
    from airflow.sdk.exceptions import AirflowFailException

    from ultracluster.parsers.pcluster import (
        ClusterAlreadyExistsError,
        ClusterValidationError,
        PclusterError,
        config_refused,
    )

    with tempfile.TemporaryDirectory(prefix="uc-dryrun-") as directory:
        path = Path(directory) / "cluster-config.yaml"
        path.write_text(config_text)
        try:
            result = hook.create_cluster(cluster_name, str(path), suppress_validators=suppress_validators, dryrun=True)
        except ClusterAlreadyExistsError:
            # A cleared or re-run render_config after pcluster_create: pcluster refuses any create of an
            # existing name, dry or not. Its config was checked when it was created; pcluster_create
            # reattaches only to a cluster of this run.
            log.warning("Cluster %s exists already: the dry run is skipped (pcluster_create checks its owner)",
                        cluster_name)
            return []
        except PclusterError as err:
            if not config_refused(err):
                raise
            errors = err.configuration_validation_errors if isinstance(err, ClusterValidationError) else []
            for entry in errors:
                log.error("pcluster dry run: %s %s: %s", entry.get("level"), entry.get("type"), entry.get("message"))
            raise AirflowFailException(
                f"pcluster create-cluster --dryrun true refused the cluster config of {cluster_name}: {err}"
            ) from err
    messages = list(result.get("validationMessages") or [])
    for entry in messages:
        log.info("pcluster dry run: %s %s: %s", entry.get("level"), entry.get("type"), entry.get("message"))
    log.info("pcluster dry run passed: %s", result.get("message", ""))
    return messages
