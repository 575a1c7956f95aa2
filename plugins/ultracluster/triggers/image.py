"""Node image wait: ``pcluster describe-image`` of each image as an asyncio subprocess, until a waiter
of waiters/pcluster.json decides for every one (ImageBuildComplete, ImageDeleteComplete).

Holds only serialisable arguments and never blocks the triggerer's event loop. Nothing to undo on
a kill: ParallelCluster refuses to delete an image while Image Builder is building it, and a deleted
image is gone.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.parsers.pcluster import PclusterAccessDeniedError, PclusterError, image_failure, image_status, public_image_description
from ultracluster.run.events import event
from ultracluster.run.states import GONE, image_verdict
from ultracluster.triggers.backoff import api_delay
from ultracluster.waiters import FAILURE, RETRY, SUCCESS, evaluate, load_waiter

# Transient CLI/API errors tolerated in a row before the wait gives up (network blips, throttling).
MAX_CONSECUTIVE_ERRORS = 5


class ImageStatusTrigger(BaseTrigger):
    """
    Poll ``pcluster describe-image`` for each of ``image_ids`` until the waiter decides for all.

    Events (``run.events``), with ``image_ids``, ``waiter_name`` and ``images`` (each decided image's
    describe-image, its presigned URL removed; a deleted one as ``{"imageBuildStatus":
    "DELETE_COMPLETE"}``): ``complete`` once every image succeeded; ``image_failed`` or ``image_gone``
    for the first that failed; ``api_error``; ``timeout``.
    """

    def __init__(self, *, image_ids: list[str], waiter_name: str, pcluster_conn_id: str = "pcluster_default",
                 region_name: str | None = None, poll_interval: float = 30, max_attempts: int = 720) -> None:
        super().__init__()
        self.image_ids = list(image_ids)
        self.waiter_name = waiter_name
        self.pcluster_conn_id = pcluster_conn_id
        self.region_name = region_name
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{self.__class__.__module__}.{self.__class__.__qualname__}",
                {"image_ids": self.image_ids, "waiter_name": self.waiter_name,
                 "pcluster_conn_id": self.pcluster_conn_id, "region_name": self.region_name,
                 "poll_interval": self.poll_interval, "max_attempts": self.max_attempts})

    def _event(self, reason: str, message: str, images: dict[str, dict]) -> TriggerEvent:
        return TriggerEvent(event(reason, message, image_ids=self.image_ids, waiter_name=self.waiter_name,
                                  images=images))

    async def _check(self, hook: ParallelClusterHook, waiter: dict, image_id: str) -> tuple[str, dict]:
        """(waiter state, what describe-image said); a PclusterError that no acceptor names raises."""
        try:
            description = await hook.adescribe_image(image_id)
        except PclusterError as error:
            state = evaluate(waiter, error=error)
            if state == RETRY:
                raise
            return state, {"imageBuildStatus": "DELETE_COMPLETE"} if state == SUCCESS else {"message": str(error)}
        return evaluate(waiter, response=description), public_image_description(description)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        waiter = load_waiter("pcluster", self.waiter_name)
        hook = ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name)
        pending, decided = list(self.image_ids), {}
        errors = 0
        for attempt in range(1, self.max_attempts + 1):
            try:
                for image_id in list(pending):
                    state, description = await self._check(hook, waiter, image_id)
                    self.log.info("Image %s: %s (attempt %d/%d)", image_id, image_status(description) or "not found",
                                  attempt, self.max_attempts)
                    if state == FAILURE:
                        gone = image_verdict(image_status(description)) == GONE or "message" in description
                        reason = "image_gone" if gone else "image_failed"
                        detail = description.get("message") or image_failure(description)
                        yield self._event(reason, f"image {image_id}: {image_status(description) or detail}: {detail}",
                                          {**decided, image_id: description})
                        return
                    if state == SUCCESS:
                        pending.remove(image_id)
                        decided[image_id] = description
                errors = 0
            except PclusterAccessDeniedError as error:
                yield self._event("access_denied", str(error), decided)
                return
            except PclusterError as error:
                errors += 1
                self.log.warning("describe-image failed (%d in a row): %s", errors, error)
                if errors >= MAX_CONSECUTIVE_ERRORS:
                    yield self._event("api_error", str(error), decided)
                    return
            if not pending:
                yield self._event("complete", f"{self.waiter_name}: {', '.join(self.image_ids)}", decided)
                return
            await asyncio.sleep(api_delay(self.poll_interval, errors))
        yield self._event("timeout", f"{', '.join(pending)} undecided after {self.max_attempts} checks", decided)
