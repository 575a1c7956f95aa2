"""record_image and delete_superseded: the built node image goes into the SSM parameter the profile
names (``node_image_parameter``), and, when asked, the images it supersedes are deleted.

An image supersedes another when both were built for the same parameter (the AMI tag
``ultracluster:node-image``, ``run.node_image``). ``pcluster delete-image`` refuses an image that
instances still use (a running cluster's nodes): such a refusal fails the task, naming the image, after
the others are gone.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from ultracluster.hooks.node_image import NodeImageHook
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.operators.node_image import image_trigger
from ultracluster.parsers.pcluster import ImageNotFoundError, PclusterError, config_refused, image_ami, image_tags
from ultracluster.run import node_image
from ultracluster.run.events import SUCCESS, deterministic

if TYPE_CHECKING:
    from airflow.sdk import Context

DELETE_WAITER = "ImageDeleteComplete"


class RecordNodeImageOperator(BaseOperator):
    """
    Put the image's AMI id into the SSM parameter the production profile reads.

    :param image: build_image's return value (``image_id``, ``ami_id``, ``tags``, ``parameter``).
    Returns ``{"parameter", "ami_id", "image_id", "previous_ami_id", "version"}``.
    """

    template_fields: Sequence[str] = ("image", "region_name")
    ui_color = "#ffd39b"

    def __init__(self, *, image: dict, region_name: str | None = None, aws_conn_id: str | None = "aws_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.image = image
        self.region_name = region_name
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        parameter, ami = node_image.check_parameter(self.image["parameter"]), self.image["ami_id"]
        tags = self.image.get("tags") or {}
        hook = NodeImageHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name or None)
        previous = hook.get_parameter(parameter)
        description = (f"ultracluster node image {self.image['image_id']}: Neuron {tags.get(node_image.TAG_RELEASE)}, "
                       f"commit {tags.get(node_image.TAG_COMMIT, '?')[:12]}")
        version = hook.put_parameter(parameter, ami, description)
        self.log.info("%s = %s (version %d; was %s)", parameter, ami, version, previous or "unset")
        return {"parameter": parameter, "ami_id": ami, "image_id": self.image["image_id"], "previous_ami_id": previous,
                "version": version}


class DeleteSupersededImagesOperator(BaseOperator):
    """
    Delete the images built for the same parameter before this one (skipped unless ``delete`` is true).

    :param image: build_image's return value; its image is kept, and so is whatever the parameter holds.
    :param delete: the run's ``delete_superseded`` param.
    Returns ``{"deleted": [image ids]}``.
    """

    template_fields: Sequence[str] = ("image", "delete", "region_name")
    ui_color = "#ffd39b"

    def __init__(self, *, image: dict, delete: Any, region_name: str | None = None,
                 aws_conn_id: str | None = "aws_default", pcluster_conn_id: str = "pcluster_default",
                 poll_interval: float = 30, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.image = image
        self.delete = delete
        self.region_name = region_name
        self.aws_conn_id = aws_conn_id
        self.pcluster_conn_id = pcluster_conn_id
        self.poll_interval = poll_interval

    def _hook(self) -> ParallelClusterHook:
        return ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)

    def execute(self, context: Context) -> dict[str, Any]:
        if str(self.delete).strip().lower() not in ("true", "1"):
            raise AirflowSkipException("delete_superseded is off: earlier images are kept")
        parameter, keep = self.image["parameter"], self.image["image_id"]
        hook = self._hook()
        current = NodeImageHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name or None).get_parameter(
            parameter)
        found = []
        for summary in hook.list_images("AVAILABLE"):
            if summary["imageId"] == keep:
                continue
            try:
                description = hook.describe_image(summary["imageId"])
            except ImageNotFoundError:
                continue  # deleted meanwhile
            if image_ami(description) != current:  # what the parameter holds stays, whoever put it there
                found.append({"imageId": summary["imageId"], "tags": image_tags(description)})
        doomed = node_image.superseded(found, keep, parameter)
        self.log.info("Images built for %s besides %s: %s", parameter, keep, ", ".join(doomed) or "none")
        refused = {}
        for image_id in doomed:
            try:
                hook.delete_image(image_id)
                self.log.info("Deleting %s", image_id)
            except ImageNotFoundError:
                self.log.info("%s is gone already", image_id)
            except PclusterError as err:
                if not config_refused(err):
                    raise
                refused[image_id] = str(err)  # in use by instances, or shared: kept
        deleting = [i for i in doomed if i not in refused]
        if not deleting:
            return self._done([], refused)
        self.defer(trigger=image_trigger(self, deleting, DELETE_WAITER), method_name="execute_complete",
                   kwargs={"refused": refused})

    def _done(self, deleted: list[str], refused: dict[str, str]) -> dict[str, Any]:
        if refused:
            raise AirflowFailException(
                f"deleted {', '.join(deleted) or 'nothing'}; pcluster delete-image refused "
                + "; ".join(f"{i}: {why}" for i, why in refused.items())
                + " (an image instances still use stays until they are gone; trigger again then)")
        return {"deleted": deleted}

    def execute_complete(self, context: Context, event: dict[str, Any], refused: dict[str, str]) -> dict[str, Any]:
        if event["status"] == SUCCESS:
            return self._done(list(event["image_ids"]), refused)
        if deterministic(event):
            raise AirflowFailException(f"deleting superseded images: {event['message']}")
        raise RuntimeError(f"waiting for superseded images to go: {event['reason']}: {event['message']}")
