"""Waits for a Slurm job on the head node, streaming its progress lines into the task log.

One asyncssh connection (providers-ssh SSHHookAsync, host key pinned) serves the whole wait: a
long-lived command on the head node checks the job about once a second and streams the log
(``SlurmHook.await_job_end``), so the job's end is seen within about a second, without polls.
The log's lines are judged by ``parsers.progress.JobLog`` (throttling, results path, budget guard).
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
from ultracluster.parsers.job_end import job_end_result
from ultracluster.parsers.progress import JobLog
from ultracluster.run.events import event
from ultracluster.run.returns import job_results_path
from ultracluster.triggers.backoff import backoff
from ultracluster.triggers.kill_guard import task_is_still_deferred
from ultracluster.triggers.task_end import ending, task_success, warm_up

# Largest log read in one command: a very chatty job cannot keep the loop on one read.
MAX_READ_BYTES = 262_144


class SlurmJobTrigger(BaseTrigger):
    """Fires once when Slurm job ``job_id`` ends (or cannot be followed any more).

    Events (``run.events``): ``complete`` or ``job_failed`` with the job's status (``state``,
    ``exit_code``, ``signal``, ``job_reason``, ``source``); ``budget_exceeded`` (the job was
    cancelled); ``job_renamed``, ``host_key_mismatch``, ``unreachable``, ``trigger_error``. Each
    carries ``job_id``, ``log_offset``, ``last_progress`` and ``results_path``.

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
    :param task_end: given, a COMPLETED job ends the task here (``triggers.task_end``) with the
        return value the worker path builds (``run.returns.job_succeeded``): the worker's part of it,
        ``{"output_dir", "started_at", "auto_resume", "health_gate", "launcher", "link_key", "link"}``
        (``link``: the Slurm Job link's values, pushed again with the job's end ``state``). None: every
        end resumes the worker.
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
        task_end: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.head_node = dict(head_node)
        self.ssh_conn_id = ssh_conn_id
        self.job_id = str(job_id)
        self.job_dir = job_dir
        self.job_name = job_name
        self.log_path = log_path
        self.poll_interval = float(poll_interval)
        self.wait_window_s = int(wait_window_s)
        self.outage_timeout = float(outage_timeout)
        self.progress_log_interval_s = float(progress_log_interval_s)
        self.progress_log_every_steps = int(progress_log_every_steps) if progress_log_every_steps else None
        self.budget = dict(budget) if budget else None
        self.task_end = dict(task_end) if task_end else None
        self.job_log = JobLog(self.log, path=log_path, offset=int(log_offset), interval_s=self.progress_log_interval_s,
                              every_steps=self.progress_log_every_steps, budget=self.budget)

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
                "log_offset": self.job_log.offset,
                "poll_interval": self.poll_interval,
                "wait_window_s": self.wait_window_s,
                "outage_timeout": self.outage_timeout,
                "progress_log_interval_s": self.progress_log_interval_s,
                "progress_log_every_steps": self.progress_log_every_steps,
                "budget": self.budget,
                "task_end": self.task_end,
            },
        )

    @property
    def log_offset(self) -> int:
        return self.job_log.offset

    def _slurm(self) -> SlurmHook:
        return SlurmHook(head_node_hook=HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node))

    def _event(self, reason: str, message: str = "", **fields: Any) -> TriggerEvent:
        return TriggerEvent(event(reason, message, job_id=self.job_id, log_offset=self.job_log.offset,
                                  last_progress=self.job_log.last_progress, results_path=self.job_log.results_path,
                                  **fields))

    async def _stream_log(self, slurm: SlurmHook, conn: Any, *, final: bool) -> None:
        for _ in range(16):  # bounded, like one read
            chunk = await slurm.aread_log_chunk(self.log_path, self.job_log.offset, MAX_READ_BYTES, conn=conn)
            if not self.job_log.consume(chunk.size, chunk.data, MAX_READ_BYTES):
                break
        self.job_log.flush(final=final)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        warm_up(self, self.task_end is not None)
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
                            yield self._event("job_renamed", f"Slurm job {self.job_id} is now {status.name!r}, "
                                                             f"not this task's {self.job_name!r}")
                            return
                        # Read the log after the state: a finished job's last lines are then in.
                        await self._stream_log(slurm, conn, final=status.terminal)
                        last_contact, failures = time.monotonic(), 0
                        if self.job_log.over_budget and not status.terminal:
                            self.log.error("%s: cancelling job %s", self.job_log.over_budget, self.job_id)
                            await slurm.ascancel(self.job_id, conn=conn)
                            yield self._event("budget_exceeded",
                                              f"{self.job_log.over_budget}; job {self.job_id} cancelled")
                            return
                        if status.terminal:
                            reason = "complete" if status.succeeded else "job_failed"
                            end = self._event(reason, f"Slurm job {self.job_id} ended {status.state}",
                                              **status.to_dict())
                            if ending(self, end.payload, self.task_end is not None):
                                end = await self._end_task(slurm, conn, end)
                            yield end
                            return
                        self.job_log.restart_stream()
                        await slurm.await_job_end(self.job_id, self.log_path, self.job_log.offset, self.job_log.stream,
                                                  conn=conn, interval_s=self.poll_interval,
                                                  window_s=self.wait_window_s)
            except HostKeyMismatchError as err:
                yield self._event("host_key_mismatch", str(err))
                return
            except HeadNodeUnreachableError as err:
                failures += 1
                down_for = time.monotonic() - last_contact
                if down_for > self.outage_timeout:
                    yield self._event("unreachable", f"Head node unreachable for {int(down_for)} s "
                                                     f"(limit {int(self.outage_timeout)} s): {err}")
                    return
                delay = backoff(failures)
                self.log.warning("Head node unreachable (attempt %d, %d s so far); retrying in %.1f s: %s",
                                 failures, int(down_for), delay, err)
                await asyncio.sleep(delay)
            except Exception as err:  # a bug or an unexpected Slurm reply: end with the reason
                self.log.exception("Slurm job trigger failed")
                yield self._event("trigger_error", f"{type(err).__name__}: {err}")
                return

    async def _end_task(self, slurm: SlurmHook, conn: Any, done: TriggerEvent) -> TriggerEvent:
        """The task's end (``task_end``): what the job left, read over ``conn``, and the return value;
        ``done``, the plain event, when that cannot be read."""
        end, payload = self.task_end or {}, done.payload
        results_path = job_results_path(payload, end["output_dir"])
        try:
            files = await slurm.ajob_end_files(self.job_dir, self.job_id, results_path, conn=conn,
                                               health_gate=bool(end.get("health_gate")),
                                               launcher=bool(end.get("launcher")))
        except Exception as err:  # e.g. the connection broke: the worker reads them again
            self.log.warning("Reading what job %s left failed (%s): the task resumes on a worker", self.job_id, err)
            return done
        result = job_end_result(payload, end, files, log_path=self.log_path, results_path=results_path, log=self.log)
        link = {**(end.get("link") or {}), "state": payload.get("state")}
        return await task_success(self, done, result, **{end["link_key"]: link} if end.get("link_key") else {})

    async def on_kill(self) -> None:
        """The user killed the deferred task: cancel the Slurm job (unless the kill is spurious).

        Connect before the state read: resolving the SSH connection asks the triggerer's supervisor to
        mask its secrets, and the state read can stall that supervisor (Airflow 3.3.2 builds its
        in-process API on the first such read), which would push scancel past on_kill's 30 s.
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
