"""ParallelClusterHook: the pcluster v3 CLI, one method per CLI verb (clusters and images).

The connection (type ``pcluster``, default ``pcluster_default``) says which CLI to run and how:
``extra = {"binary": "/path/to/pcluster", "region": "us-east-1", "env": {"AWS_PROFILE": ...}}``; with
a profile, the CLI signs as that profile's role, never with the worker's own keys (``run.cli_credentials``).
The same hook drives real AWS ParallelCluster and the local UltraCluster's pcluster-compatible CLI;
only the connection differs.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import urllib.request
from typing import Any

from airflow.sdk import BaseHook

from ultracluster.parsers.pcluster import PclusterError, dryrun_succeeded, parse_cli_result
from ultracluster.run.cli_credentials import CredentialsConflictError, child_env

# create-cluster without --wait returns once CloudFormation accepted the stack; describe is quick.
DEFAULT_CLI_TIMEOUT_S = 900
# Reading a cluster's configuration (a few KB from S3).
CONFIG_READ_TIMEOUT_S = 60


class ParallelClusterHook(BaseHook):
    """Run ``pcluster`` verbs and return their parsed JSON; failures raise typed PclusterError."""

    conn_name_attr = "pcluster_conn_id"
    default_conn_name = "pcluster_default"
    conn_type = "pcluster"
    hook_name = "AWS ParallelCluster CLI"

    def __init__(
        self,
        pcluster_conn_id: str | None = default_conn_name,
        *,
        region_name: str | None = None,
        cli_timeout: float = DEFAULT_CLI_TIMEOUT_S,
    ) -> None:
        super().__init__()
        self.pcluster_conn_id = pcluster_conn_id
        self._region_override = region_name
        self.cli_timeout = cli_timeout
        self._settings: dict[str, Any] | None = None

    # --- connection -------------------------------------------------------------------------
    def _settings_from_extra(self, extra: dict[str, Any]) -> dict[str, Any]:
        binary = extra.get("binary") or "pcluster"
        resolved = shutil.which(binary) if not os.path.isabs(binary) else binary
        if not resolved:
            raise PclusterError(
                f"pcluster binary {binary!r} not found; set extra.binary on connection "
                f"{self.pcluster_conn_id!r}"
            )
        # Values may be credentials: they go to the child's environment and nowhere else.
        try:
            env = child_env(os.environ, extra.get("env") or {})
        except CredentialsConflictError as err:
            raise PclusterError(f"connection {self.pcluster_conn_id!r}: {err}") from None
        return {
            "binary": resolved,
            "region": self._region_override or extra.get("region") or env.get("AWS_DEFAULT_REGION"),
            "env": env,
        }

    def _get_settings(self) -> dict[str, Any]:
        if self._settings is None:
            extra = self.get_connection(self.pcluster_conn_id).extra_dejson if self.pcluster_conn_id else {}
            self._settings = self._settings_from_extra(extra)
        return self._settings

    async def _aget_settings(self) -> dict[str, Any]:
        # Triggers run in the triggerer's event loop: the sync connection lookup would block it.
        if self._settings is None:
            extra = {}
            if self.pcluster_conn_id:
                extra = (await self.aget_connection(self.pcluster_conn_id)).extra_dejson
            self._settings = self._settings_from_extra(extra)
        return self._settings

    def get_conn(self) -> dict[str, Any]:
        return self._get_settings()

    @property
    def region_name(self) -> str | None:
        return self._get_settings()["region"]

    # --- invocation ---------------------------------------------------------------------------
    @staticmethod
    def _argv(settings: dict[str, Any], verb: str, args: list[str]) -> list[str]:
        argv = [settings["binary"], verb, *args]
        if settings["region"]:
            argv += ["--region", settings["region"]]
        return argv

    def _run(self, verb: str, *args: str) -> dict:
        settings = self._get_settings()
        argv = self._argv(settings, verb, list(args))
        self.log.info("Running: %s", " ".join(argv))
        try:
            completed = subprocess.run(
                argv, capture_output=True, text=True, env=settings["env"], timeout=self.cli_timeout, check=False
            )
        except subprocess.TimeoutExpired as err:
            raise PclusterError(f"pcluster {verb} did not finish within {self.cli_timeout}s") from err
        return parse_cli_result(completed.returncode, completed.stdout, completed.stderr)

    async def _arun(self, verb: str, *args: str) -> dict:
        settings = await self._aget_settings()
        argv = self._argv(settings, verb, list(args))
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=settings["env"]
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=self.cli_timeout)
        except asyncio.TimeoutError as err:
            await self._akill(process)
            raise PclusterError(f"pcluster {verb} did not finish within {self.cli_timeout}s") from err
        except asyncio.CancelledError:
            # A cancelled trigger must not leave a pcluster child behind.
            await self._akill(process)
            raise
        return parse_cli_result(process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"))

    @staticmethod
    async def _akill(process: asyncio.subprocess.Process) -> None:
        if process.returncode is None:
            process.kill()
            await process.wait()

    # --- verbs --------------------------------------------------------------------------------
    def create_cluster(
        self,
        cluster_name: str,
        config_path: str,
        *,
        rollback_on_failure: bool = False,
        suppress_validators: list[str] | None = None,
        dryrun: bool = False,
    ) -> dict:
        """``pcluster create-cluster`` (no --wait: callers wait with a trigger).

        With ``dryrun``, ``--dryrun true``: ParallelCluster's validators only, nothing is created. The
        answer pcluster gives a config it would accept (exit 1, "Request would have succeeded, but
        DryRun flag is set.") is returned as ``{"message", "validationMessages"}``; a refused config
        raises ClusterValidationError (or a PclusterError, see ``parsers.pcluster.config_refused``).
        """
        args = [
            "--cluster-name", cluster_name,
            "--cluster-configuration", config_path,
            "--rollback-on-failure", "true" if rollback_on_failure else "false",
        ]
        if suppress_validators:
            args += ["--suppress-validators", *suppress_validators]
        return self._create("create-cluster", args, dryrun)

    def _create(self, verb: str, args: list[str], dryrun: bool) -> dict:
        """A create verb; a dry run's "would have succeeded" answer (exit 1) as ``{"message",
        "validationMessages"}``."""
        if not dryrun:
            return self._run(verb, *args)
        try:
            return self._run(verb, *args, "--dryrun", "true")
        except PclusterError as err:
            if dryrun_succeeded(err):
                return {"message": err.message, "validationMessages": list(err.payload.get("validationMessages") or [])}
            raise

    def describe_cluster(self, cluster_name: str) -> dict:
        return self._run("describe-cluster", "--cluster-name", cluster_name)

    def get_cluster_configuration(self, description: dict) -> str:
        """The cluster's configuration (YAML), read from describe-cluster's ``clusterConfiguration.url``:
        a presigned S3 URL, so no S3 permission beyond pcluster's is needed. The URL is a secret: it
        is never logged, and errors quote it redacted."""
        url = (description.get("clusterConfiguration") or {}).get("url")
        name = description.get("clusterName")
        if not url:
            raise PclusterError(f"describe-cluster of {name} gives no clusterConfiguration.url")
        try:
            with urllib.request.urlopen(url, timeout=CONFIG_READ_TIMEOUT_S) as response:
                return response.read().decode()
        except (OSError, ValueError) as err:  # urllib's URLError and HTTPError are OSErrors
            raise PclusterError(f"cannot read the configuration of cluster {name}: {err}") from None

    async def adescribe_cluster(self, cluster_name: str) -> dict:
        return await self._arun("describe-cluster", "--cluster-name", cluster_name)

    def delete_cluster(self, cluster_name: str) -> dict:
        return self._run("delete-cluster", "--cluster-name", cluster_name)

    def list_clusters(self) -> list[dict]:
        clusters: list[dict] = []
        token: str | None = None
        while True:
            page = self._run("list-clusters", *(["--next-token", token] if token else []))
            clusters += page.get("clusters") or []
            token = page.get("nextToken")
            if not token:
                return clusters

    def describe_cluster_instances(self, cluster_name: str) -> list[dict]:
        instances: list[dict] = []
        token: str | None = None
        while True:
            args = ["--cluster-name", cluster_name] + (["--next-token", token] if token else [])
            page = self._run("describe-cluster-instances", *args)
            instances += page.get("instances") or []
            token = page.get("nextToken")
            if not token:
                return instances

    def describe_compute_fleet(self, cluster_name: str) -> dict:
        return self._run("describe-compute-fleet", "--cluster-name", cluster_name)

    def update_compute_fleet(self, cluster_name: str, status: str) -> dict:
        return self._run("update-compute-fleet", "--cluster-name", cluster_name, "--status", status)

    def build_image(self, image_id: str, config_path: str, *, suppress_validators: list[str] | None = None,
                    dryrun: bool = False) -> dict:
        """``pcluster build-image`` (returns once the build stack is accepted; callers wait with a trigger).
        With ``dryrun``, the validators only, answered as ``create_cluster``'s dry run is."""
        args = ["--image-id", image_id, "--image-configuration", config_path]
        if suppress_validators:
            args += ["--suppress-validators", *suppress_validators]
        return self._create("build-image", args, dryrun)

    def describe_image(self, image_id: str) -> dict:
        return self._run("describe-image", "--image-id", image_id)

    async def adescribe_image(self, image_id: str) -> dict:
        return await self._arun("describe-image", "--image-id", image_id)

    def list_images(self, image_status: str) -> list[dict]:
        """Images of one status: AVAILABLE (built), PENDING or FAILED (their build stacks)."""
        images: list[dict] = []
        token: str | None = None
        while True:
            page = self._run("list-images", "--image-status", image_status, *(["--next-token", token] if token else []))
            images += page.get("images") or []
            token = page.get("nextToken")
            if not token:
                return images

    def delete_image(self, image_id: str) -> dict:
        """``pcluster delete-image`` without --force: refused while instances use the image."""
        return self._run("delete-image", "--image-id", image_id)

    def list_official_images(self, os_name: str, architecture: str) -> list[dict]:
        return self._run("list-official-images", "--os", os_name, "--architecture", architecture).get("images") or []

    def get_cluster_stack_events(self, cluster_name: str, *, max_pages: int = 3) -> list[dict]:
        """The cluster stack's events, newest first (the first ``max_pages`` pages: the recent ones)."""
        events: list[dict] = []
        token: str | None = None
        for _ in range(max_pages):
            args = ["--cluster-name", cluster_name] + (["--next-token", token] if token else [])
            page = self._run("get-cluster-stack-events", *args)
            events += page.get("events") or []
            token = page.get("nextToken")
            if not token:
                break
        return events

    def list_cluster_log_streams(self, cluster_name: str, filters: list[str] | None = None) -> list[dict]:
        """Log streams of the cluster; ``filters`` like ``["Name=node-type,Values=HeadNode"]``."""
        streams: list[dict] = []
        token: str | None = None
        while True:
            args = ["--cluster-name", cluster_name]
            args += (["--filters", *filters] if filters else []) + (["--next-token", token] if token else [])
            page = self._run("list-cluster-log-streams", *args)
            streams += page.get("logStreams") or []
            token = page.get("nextToken")
            if not token:
                return streams

    def get_cluster_log_events(
        self, cluster_name: str, log_stream_name: str, *, limit: int | None = None, start_from_head: bool | None = None
    ) -> dict:
        """One page of a stream's events, in time order; ``start_from_head=False`` with ``limit`` is its tail."""
        args = ["--cluster-name", cluster_name, "--log-stream-name", log_stream_name]
        if limit is not None:
            args += ["--limit", str(int(limit))]
        if start_from_head is not None:
            args += ["--start-from-head", "true" if start_from_head else "false"]
        return self._run("get-cluster-log-events", *args)
