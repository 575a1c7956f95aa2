"""build_image: the Trn1 node image, ``pcluster build-image`` of include/cluster/image-config.yaml with
the rendered node script as its component, waited for deferrably (``triggers.image``).

The image id derives from the Neuron pins and the repository's commit (``run.node_image``), so a
retry or a second trigger of the same commit finds the image it built instead of building another:
a built one is returned as it is, a building one waited for, a failed one named (delete it first).
"""
from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.parsers.pcluster import (
    ImageAlreadyExistsError,
    ImageNotFoundError,
    PclusterError,
    config_refused,
    image_ami,
    image_failure,
    image_status,
    image_tags,
)
from ultracluster.run import node_image
from ultracluster.run.events import SUCCESS, deterministic
from ultracluster.run.neuron_versions import load_versions, render_on_node_configured
from ultracluster.run.profiles import include_dir
from ultracluster.run.s3 import check_sse, split_s3_uri
from ultracluster.run.states import BUILD_COMPLETE, BUILD_FAILED, BUILD_IN_PROGRESS
from ultracluster.triggers.image import ImageStatusTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

BUILD_WAITER = "ImageBuildComplete"


def image_trigger(op: Any, image_ids: list[str], waiter_name: str) -> ImageStatusTrigger:
    """The wait of a node image operator (``op``) on its images."""
    return ImageStatusTrigger(image_ids=image_ids, waiter_name=waiter_name, pcluster_conn_id=op.pcluster_conn_id,
                              region_name=op.region_name or None, poll_interval=op.poll_interval)


def failed_build(image_id: str, why: str) -> AirflowFailException:
    return AirflowFailException(
        f"node image {image_id} failed to build: {why}. Its logs: pcluster list-image-log-streams -i {image_id} "
        f"(then get-image-log-events); delete it (pcluster delete-image -i {image_id}) before triggering again")


class BuildNodeImageOperator(BaseOperator):
    """
    Build (or find) the node image of the pinned Neuron stack at this commit.

    :param parameter: the SSM parameter the image is built for (the profile's ``node_image_parameter``):
        tagged on the AMI, so that trn1_build_image knows which images supersede each other.
    :param parent_image: the AMI to build on; None: ParallelCluster's official AMI of ``image_os``
        (``pcluster list-official-images``).
    :param artifacts_s3_uri: where the rendered node script goes (``<prefix>/images/<image id>/``): the
        build's component, which the build instance reads from S3.
    :param permissions_boundary_arn: ``Build.Iam.PermissionsBoundary`` of the role the build creates
        (ParallelCluster's PermissionsBoundary mode); it needs ``cleanup_role_arn`` too.
    :param cleanup_role_arn: ``Build.Iam.CleanupLambdaRole`` (ParallelCluster creates its own without).
    Returns ``{"image_id", "ami_id", "tags", "parameter", "built"}`` (``built``: False when this commit's
    image existed already).
    """

    template_fields: Sequence[str] = ("parameter", "region_name", "image_os", "parent_image", "artifacts_s3_uri")
    ui_color = "#ffd39b"

    def __init__(self, *, parameter: str, region_name: str | None, image_os: str, artifacts_s3_uri: str,
                 parent_image: str | None = None, permissions_boundary_arn: str | None = None,
                 cleanup_role_arn: str | None = None, aws_conn_id: str | None = "aws_default",
                 pcluster_conn_id: str = "pcluster_default", s3_encryption: Mapping[str, str] | None = None,
                 poll_interval: float = 30, suppress_validators: list[str] | None = None,
                 config_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parameter = parameter
        self.region_name = region_name
        self.image_os = image_os
        self.parent_image = parent_image
        self.artifacts_s3_uri = artifacts_s3_uri
        self.permissions_boundary_arn = permissions_boundary_arn or None
        self.cleanup_role_arn = cleanup_role_arn or None
        self.aws_conn_id = aws_conn_id
        self.pcluster_conn_id = pcluster_conn_id
        self.s3_encryption = check_sse(s3_encryption)
        self.poll_interval = poll_interval
        self.suppress_validators = suppress_validators
        self.config_path = config_path or str(include_dir() / "cluster" / "image-config.yaml")

    def _hook(self) -> ParallelClusterHook:
        return ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)

    def execute(self, context: Context) -> dict[str, Any]:
        try:
            node_image.check_parameter(self.parameter)
            node_image.check_roles(self.permissions_boundary_arn, self.cleanup_role_arn)
            versions = load_versions()
            commit = node_image.repository_commit()
        except ValueError as err:
            raise AirflowFailException(str(err)) from None
        image_id = node_image.image_id_for(versions, commit)
        tags = node_image.ami_tags(versions, commit, self.parameter)
        self.log.info("Node image %s: Neuron %s, commit %s, for %s", image_id, versions["NEURON_RELEASE"], commit,
                      self.parameter)
        hook = self._hook()
        try:
            found = hook.describe_image(image_id)
        except ImageNotFoundError:
            found = None
        if found is not None:
            return self._reattach(image_id, found)
        config = self._config(hook, image_id, tags)
        self.log.info("Image configuration:\n%s", config)
        with tempfile.TemporaryDirectory(prefix="uc-image-") as directory:
            path = Path(directory) / "image-config.yaml"
            path.write_text(config)
            try:
                started = hook.build_image(image_id, str(path), suppress_validators=self.suppress_validators)
            except ImageAlreadyExistsError:
                started = {"image": {"imageBuildStatus": BUILD_IN_PROGRESS}}  # a concurrent try: wait for it
            except PclusterError as err:
                if config_refused(err):
                    raise AirflowFailException(f"pcluster build-image refused the image configuration: {err}") from err
                raise
        for message in started.get("validationMessages") or []:
            self.log.info("pcluster build-image: %s %s: %s", message.get("level"), message.get("type"),
                          message.get("message"))
        self.log.info("Building %s (%s)", image_id, image_status(started))
        self.defer(trigger=image_trigger(self, [image_id], BUILD_WAITER), method_name="execute_complete")

    def _reattach(self, image_id: str, found: dict) -> dict[str, Any]:
        status = image_status(found)
        if status == BUILD_COMPLETE:
            self.log.info("Node image %s exists already (%s): not built again", image_id, image_ami(found))
            return self._result(image_id, found, built=False)
        if status == BUILD_IN_PROGRESS:
            self.log.info("Node image %s is building: waiting for it", image_id)
            self.defer(trigger=image_trigger(self, [image_id], BUILD_WAITER), method_name="execute_complete")
        if status == BUILD_FAILED:
            raise failed_build(image_id, image_failure(found))
        raise AirflowFailException(f"node image {image_id} is {status}: wait until it is gone, then trigger again")

    def _config(self, hook: ParallelClusterHook, image_id: str, tags: dict[str, str]) -> str:
        """The rendered node script uploaded, and the image configuration that builds it in."""
        parent = self.parent_image or self._official_image(hook)
        bucket, prefix = split_s3_uri(self.artifacts_s3_uri.rstrip("/") + "/")
        # Not on_node_configured.sh: the reaper takes that name for a run's scratch; this is the image's record.
        key = f"{prefix}images/{image_id}/image-setup.sh"
        # The image holds the stack itself: its own script need not install at boot (and never does there).
        ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption).load_string(
            render_on_node_configured(), key=key, bucket_name=bucket, replace=True)
        base = yaml.safe_load(Path(self.config_path).read_text()) or {}
        try:
            config = node_image.image_config(
                base, image_id=image_id, region=self.region_name or hook.region_name, parent_image=parent,
                script_uri=f"s3://{bucket}/{key}", tags=tags, permissions_boundary=self.permissions_boundary_arn,
                cleanup_role=self.cleanup_role_arn)
        except node_image.NodeImageError as err:
            raise AirflowFailException(str(err)) from None
        return yaml.safe_dump(config, sort_keys=False)

    def _official_image(self, hook: ParallelClusterHook) -> str:
        images = [i for i in hook.list_official_images(self.image_os, node_image.ARCHITECTURE)
                  if i.get("os") == self.image_os]
        if not images:
            raise AirflowFailException(f"pcluster list-official-images has no {self.image_os} "
                                       f"{node_image.ARCHITECTURE} image in this region: name parent_image")
        self.log.info("Parent image: %s (%s)", images[0]["amiId"], images[0].get("name"))
        return images[0]["amiId"]

    def _result(self, image_id: str, description: dict, *, built: bool) -> dict[str, Any]:
        ami, tags = image_ami(description), image_tags(description)
        if not ami:
            raise RuntimeError(f"describe-image of {image_id} names no AMI yet")  # the retry describes it again
        problems = node_image.image_problems(ami, tags, load_versions(), f"image {image_id}")
        if problems:
            raise AirflowFailException("; ".join(problems))
        return {"image_id": image_id, "ami_id": ami, "tags": tags, "parameter": self.parameter, "built": built}

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        [image_id] = event["image_ids"]
        if event["status"] == SUCCESS:
            description = event["images"][image_id]
            if not image_ami(description):
                description = self._hook().describe_image(image_id)
            return self._result(image_id, description, built=True)
        if deterministic(event):
            raise failed_build(image_id, event["message"])
        raise RuntimeError(f"waiting for node image {image_id}: {event['reason']}: {event['message']}")
