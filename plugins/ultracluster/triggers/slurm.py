"""Waits for a Slurm job on the head node, streaming its progress lines into the task log.

One asyncssh connection (providers-ssh SSHHookAsync, host key pinned) serves the whole wait: a
long-lived command on the head node checks the job about once a second and streams the log
(``SlurmHook.await_job_end``), so the job's end is seen within about a second, without polls.
An unreachable head node is retried with backoff for up to ``outage_timeout`` seconds; only a host
key mismatch or a longer outage ends the trigger with an error event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ultracluster.hooks.head_node import HeadNodeHook, HeadNodeUnreachableError, HostKeyMismatchError
from ultracluster.hooks.slurm import WAIT_WINDOW_S, SlurmHook
from ultracluster.parsers import progress as parse
from ultracluster.triggers._backoff import backoff
from ultracluster.triggers._kill_guard import task_is_still_deferred


class SlurmJobTrigger(BaseTrigger):
    """Fires once when Slurm job ``job_id`` ends (or cannot be followed any more).

    :param head_node: ``{"cluster_name", "address", "host_key", ...}`` from wait_for_fleet.
    :param ssh_conn_id: SSH connection (user, key, port).
    :param job_id: Slurm job id.
    :param job_name: the job's Slurm name; a job id that now names another job (a rebuilt cluster
        reuses ids) ends the wait with an error instead of following a stranger's job.
    :param job_dir: job directory on shared storage (holds the exit marker).
    :param log_path: the job's Slurm output file.
    :param log_offset: byte offset already streamed (carried across deferrals and retries).
    :param poll_interval: seconds between the head node's local checks of the job (one ``squeue`` of
        this job each), so the job's end reaches the trigger about this long after Slurm records it.
    :param wait_window_s: the head-node wait command runs at most this long before the trigger reads
        the job's status itself and starts another, on the same connection.
    :param outage_timeout: seconds the head node may stay unreachable before giving up.
    :param progress_log_interval_s: at most one ``UC_PROGRESS`` line per this many seconds in the
        task log (the job's own log keeps every line).
    :param progress_log_every_steps: instead, one line every this many steps.
    :param budget: ``{"max_usd", "usd_per_hour", "since"}`` (``cost.budget_verdict``): once a progress
        line projects the run past ``max_usd``, the job is cancelled and the event says why.
    """

    def __init__(
        self,
        *,
        head_node: dict[str, Any],
        ssh_conn_id: str,
        job_id: str,
        job_dir: str,
        job_name: str | None = None,
        log_path: str,
        log_offset: int = 0,
        poll_interval: float = 1,
        wait_window_s: int = WAIT_WINDOW_S,
        outage_timeout: float = 900,
        progress_log_interval_s: float = 30,
        progress_log_every_steps: int | None = None,
        budget: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.head_node = dict(head_node)
        self.ssh_conn_id = ssh_conn_id
        self.job_id = str(job_id)
        self.job_dir = job_dir
        self.job_name = job_name
        self.log_path = log_path
        self.log_offset = int(log_offset)
        self.poll_interval = float(poll_interval)
        self.wait_window_s = int(wait_window_s)
        self.outage_timeout = float(outage_timeout)
        self.progress_log_interval_s = float(progress_log_interval_s)
        self.progress_log_every_steps = int(progress_log_every_steps) if progress_log_every_steps else None
        self._throttle = parse.ProgressThrottle(
            interval_s=self.progress_log_interval_s, every_steps=self.progress_log_every_steps
        )
        self.budget = dict(budget) if budget else None
        self._over_budget: str | None = None
        self._progress_seen = 0
        self._last_progress: dict[str, Any] | None = None
        self._results_path: str | None = None
        self._pending = b""  # streamed bytes after the last complete line

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "head_node": self.head_node,
                "ssh_conn_id": self.ssh_conn_id,
                "job_id": self.job_id,
                "job_dir": self.job_dir,
                "job_name": self.job_name,
                "log_path": self.log_path,
                "log_offset": self.log_offset,
                "poll_interval": self.poll_interval,
                "wait_window_s": self.wait_window_s,
                "outage_timeout": self.outage_timeout,
                "progress_log_interval_s": self.progress_log_interval_s,
                "progress_log_every_steps": self.progress_log_every_steps,
                "budget": self.budget,
            },
        )

    def _slurm(self) -> SlurmHook:
        return SlurmHook(head_node_hook=HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node))

    def _event(self, status: str, **fields: Any) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "job_id": self.job_id,
                "log_offset": self.log_offset,
                "last_progress": self._last_progress,
                "results_path": self._results_path,
                **fields,
            }
        )

    def _consume_log(self, chunk_size: int, data: bytes, max_bytes: int) -> bool:
        """Log the complete new lines; return True when more data is waiting."""
        if chunk_size >= 0 and chunk_size < self.log_offset:
            # The log was replaced (a job rerun into the same file): start again from its top.
            self.log.warning("Slurm log %s shrank below offset %d; rereading it", self.log_path, self.log_offset)
            self.log_offset = 0
            return True
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) >= max_bytes:
            end = len(data)  # one enormous line: move past it rather than stall on it forever
        now = time.monotonic()
        for raw in data[:end].splitlines():
            line = raw.decode("utf-8", errors="replace").strip()
            if not parse.has_marker(line):
                continue
            if (progress := parse.parse_progress_line(line)) is not None:
                self._last_progress = progress.to_dict()
                self._progress_seen += 1
                # Not on the first line seen: its ETA comes from a step that includes warm-up
                # (graph load, compile) and overstates the rest of the run many times over.
                if self.budget and not self._over_budget and self._progress_seen > 1:
                    from ultracluster.cost import budget_verdict

                    self._over_budget = budget_verdict(self.budget, progress.eta_s)
                for shown in self._throttle.offer(line, progress, now):
                    self.log.info("%s", shown)
                continue
            # The newest held-back progress line goes first: it is the context of an error or result.
            for shown in [*self._throttle.flush(now, final=True), line]:
                self.log.info("%s", shown)
            if (results := parse.find_results_path(line)) is not None:
                self._results_path = results
        self.log_offset += end
        # Only a read cut at max_bytes means more is waiting; a trailing partial line waits for the next poll.
        return end > 0 and len(data) >= max_bytes

    async def _stream_log(self, slurm: SlurmHook, conn: Any, *, final: bool, max_bytes: int = 262_144) -> None:
        # Bounded: a very chatty job cannot keep the loop here forever.
        for _ in range(16):
            chunk = await slurm.aread_log_chunk(self.log_path, self.log_offset, max_bytes, conn=conn)
            if not self._consume_log(chunk.size, chunk.data, max_bytes):
                break
        for shown in self._throttle.flush(time.monotonic(), final=final):
            self.log.info("%s", shown)

    def _on_stream(self, chunk: bytes) -> bool:
        """Log the streamed lines as they come; False (stop waiting) once the budget is exceeded."""
        self._pending += chunk
        before = self.log_offset
        self._consume_log(-1, self._pending, max_bytes=len(self._pending) + 1)
        self._pending = self._pending[self.log_offset - before:]
        for shown in self._throttle.flush(time.monotonic(), final=False):
            self.log.info("%s", shown)
        return not self._over_budget

    async def run(self) -> AsyncIterator[TriggerEvent]:
        slurm = self._slurm()
        head_node_hook = slurm.head_node_hook
        last_contact = time.monotonic()
        failures = 0
        while True:
            try:
                async with head_node_hook.aconnection() as conn:
                    while True:
                        status = await slurm.ajob_status(self.job_id, self.job_dir, job_name=self.job_name, conn=conn)
                        if self.job_name and status.name and status.name != self.job_name:
                            yield self._event("error", message=f"Slurm job {self.job_id} is now {status.name!r}, "
                                                               f"not this task's {self.job_name!r}")
                            return
                        # Read the log after the state: a finished job's last lines are then in.
                        await self._stream_log(slurm, conn, final=status.terminal)
                        last_contact, failures = time.monotonic(), 0
                        if self._over_budget and not status.terminal:
                            self.log.error("%s: cancelling job %s", self._over_budget, self.job_id)
                            await slurm.ascancel(self.job_id, conn=conn)
                            yield self._event("budget", message=f"{self._over_budget}; job {self.job_id} cancelled")
                            return
                        if status.terminal:
                            yield self._event("success" if status.succeeded else "failed", **status.to_dict())
                            return
                        self._pending = b""
                        await slurm.await_job_end(self.job_id, self.log_path, self.log_offset, self._on_stream,
                                                  conn=conn, interval_s=self.poll_interval,
                                                  window_s=self.wait_window_s)
            except HostKeyMismatchError as err:
                yield self._event("host_key_mismatch", message=str(err))
                return
            except HeadNodeUnreachableError as err:
                failures += 1
                down_for = time.monotonic() - last_contact
                if down_for > self.outage_timeout:
                    yield self._event(
                        "error",
                        message=f"Head node unreachable for {int(down_for)} s (limit {int(self.outage_timeout)} s): {err}",
                    )
                    return
                delay = backoff(failures)
                self.log.warning(
                    "Head node unreachable (attempt %d, %d s so far); retrying in %.1f s: %s",
                    failures,
                    int(down_for),
                    delay,
                    err,
                )
                await asyncio.sleep(delay)
            except Exception as err:  # a bug or an unexpected Slurm reply: end with the reason
                self.log.exception("Slurm job trigger failed")
                yield self._event("error", message=f"{type(err).__name__}: {err}")
                return

    async def on_kill(self) -> None:
        """The user killed the deferred task: cancel the Slurm job (unless the kill is spurious).

        Connect before the state read: resolving the SSH connection asks the triggerer's supervisor to
        mask its secrets, and the state read can stall that supervisor (Airflow 3.3.2 builds its
        in-process API on the first such read: ~32 s seen), leaving scancel past on_kill's 30 s.
        """
        slurm = self._slurm()
        async with asyncio.timeout(25), slurm.head_node_hook.aconnection() as conn:
            if await task_is_still_deferred(self.task_instance):
                self.log.warning(
                    "on_kill fired while the task is still deferred (trigger moved?); job %s kept", self.job_id
                )
                return
            self.log.info("Task killed: scancel %s", self.job_id)
            await slurm.ascancel(self.job_id, conn=conn)
