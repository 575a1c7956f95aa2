"""Slurm on the head node: thin wrappers named after the Slurm commands they run.

Commands come from ``ultracluster.remote_commands``, parses from ``ultracluster.parsers.slurm``;
this module only runs them through ``HeadNodeHook`` (sync) or its asyncssh path (async).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from ultracluster import remote_commands
from ultracluster.hooks.head_node import DEFAULT_SSH_CONN_ID, CommandResult, HeadNodeHook
from ultracluster.parsers import slurm as parse

if TYPE_CHECKING:
    import asyncssh


class SlurmCommandError(RuntimeError):
    """A Slurm command failed on the head node."""


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands, from the best source still available."""

    job_id: str
    state: str  # Slurm base state, or "UNKNOWN" when no source knows the job any more
    exit_code: int | None
    signal: int | None
    reason: str | None
    source: str  # "scontrol", "sacct" or "exit_marker"
    name: str | None = None  # the job name, when the source reports it


    @property
    def terminal(self) -> bool:
        return self.state in parse.TERMINAL_STATES or self.state == "UNKNOWN"

    @property
    def succeeded(self) -> bool:
        return self.state in parse.SUCCESS_STATES

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "source": self.source,
        }


@dataclass(frozen=True)
class LogChunk:
    size: int  # the file's size now; -1 when it does not exist yet
    data: bytes  # bytes from the requested offset


def _checked(command: remote_commands.RemoteCommand, result: CommandResult) -> CommandResult:
    if not result.ok:
        raise SlurmCommandError(
            f"`{command}` failed (exit {result.exit_status}): {(result.stderr or result.stdout).strip()[:2000]}"
        )
    return result


def _status_from_scontrol(job_id: str, result: CommandResult) -> JobStatus | None:
    if not result.ok:
        if parse.is_unknown_job_error(result.stderr):
            return None
        raise SlurmCommandError(f"scontrol show job {job_id} failed: {result.stderr.strip()[:2000]}")
    info = parse.parse_scontrol_show_job(result.stdout)
    return JobStatus(info.job_id, info.state, info.exit_code, info.signal, info.reason, "scontrol", info.name)


def _status_from_sacct(job_id: str, result: CommandResult, job_name: str | None = None) -> JobStatus | None:
    """``job_name``: the sacct command filtered on it, so a row found is a job of that name."""
    if not result.ok or parse.is_accounting_disabled(result.stdout + result.stderr):
        return None
    parsed = parse.parse_sacct(result.stdout, job_id)
    if parsed is None:
        return None
    state, exit_code, signal = parsed
    return JobStatus(job_id, state, exit_code, signal, None, "sacct", job_name)


def _status_from_exit_marker(job_id: str, result: CommandResult) -> JobStatus:
    text = result.stdout.strip()
    if result.ok and text.lstrip("-").isdigit():
        code = int(text)
        return JobStatus(job_id, "COMPLETED" if code == 0 else "FAILED", code, 0, "from exit marker", "exit_marker")
    return JobStatus(
        job_id,
        "UNKNOWN",
        None,
        None,
        "slurmctld no longer knows the job (MinJobAge), there is no accounting and no exit marker",
        "exit_marker",
    )


def _log_chunk(result: CommandResult) -> LogChunk:
    lines = result.stdout.split("\n", 1)
    try:
        size = int(lines[0].strip())
    except ValueError:
        raise SlurmCommandError(f"Unexpected log read output: {result.stdout[:200]!r}") from None
    if size < 0:
        return LogChunk(-1, b"")
    try:
        data = base64.b64decode(lines[1].strip()) if len(lines) > 1 else b""
    except binascii.Error as err:
        raise SlurmCommandError(f"Log chunk is not base64: {err}") from None
    return LogChunk(size, data)


class SlurmHook(BaseHook):
    """Slurm commands on one cluster's head node (over ``HeadNodeHook``)."""

    conn_name_attr = "ssh_conn_id"
    default_conn_name = DEFAULT_SSH_CONN_ID
    conn_type = "ssh"
    hook_name = "UltraCluster Slurm"

    def __init__(
        self,
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        head_node: Mapping[str, Any] | None = None,
        *,
        head_node_hook: HeadNodeHook | None = None,
    ) -> None:
        super().__init__()
        self.head_node_hook = head_node_hook or HeadNodeHook(ssh_conn_id=ssh_conn_id, head_node=head_node)

    # ------------------------------------------------------------------------------- sync

    def _run(self, command: remote_commands.RemoteCommand) -> CommandResult:
        return self.head_node_hook.run(command)

    def sinfo(self, partition: str | None = None) -> list[parse.NodeStatus]:
        command = remote_commands.sinfo(partition)
        return parse.parse_sinfo(_checked(command, self._run(command)).stdout)

    def squeue_by_name(self, job_name: str) -> list[parse.QueuedJob]:
        command = remote_commands.squeue_by_name(job_name)
        return parse.parse_squeue(_checked(command, self._run(command)).stdout)

    def squeue_job(self, job_id: str) -> list[parse.QueuedJob]:
        """The job of this id if slurmctld still knows it (name and comment included), else []."""
        command = remote_commands.squeue_job(job_id)
        result = self._run(command)
        if not result.ok and parse.is_unknown_job_error(result.stderr):
            return []
        return [job for job in parse.parse_squeue(_checked(command, result).stdout) if job.job_id == str(job_id)]

    def scontrol_show_job(self, job_id: str) -> JobStatus | None:
        """None when slurmctld does not know the job (finished longer than MinJobAge ago)."""
        return _status_from_scontrol(job_id, self._run(remote_commands.scontrol_show_job(job_id)))

    def sbatch(self, **sbatch_args: Any) -> str:
        """Submit (arguments as ``remote_commands.sbatch``); returns the job id."""
        command = remote_commands.sbatch(**sbatch_args)
        result = self._run(command)
        if not result.ok:
            raise SlurmCommandError(f"sbatch refused the job: {result.stderr.strip()[:2000]}")
        return parse.parse_sbatch(result.stdout)

    def scancel(self, job_id: str) -> None:
        command = remote_commands.scancel(job_id)
        _checked(command, self._run(command))

    def job_status(self, job_id: str, job_dir: str, *, job_name: str | None = None) -> JobStatus:
        """scontrol, then sacct (when accounting exists), then the job's exit marker file.

        ``job_name`` restricts sacct to a job of that name (the status then carries the name).
        """
        status = self.scontrol_show_job(job_id)
        if status is None:
            command = remote_commands.sacct_job(job_id, job_name)
            status = _status_from_sacct(job_id, self._run(command), job_name)
        if status is None:
            marker = remote_commands.job_exit_marker_path(job_dir, job_id)
            status = _status_from_exit_marker(job_id, self._run(remote_commands.read_file(marker, 64)))
            if job_name is not None and status.state != "UNKNOWN":
                name_file = remote_commands.job_name_marker_path(job_dir, job_id)
                name = self._run(remote_commands.read_file(name_file, 1024)).stdout.strip()
                status = dataclasses.replace(status, name=name or None)
        return status

    def read_log_chunk(self, path: str, offset: int, max_bytes: int = 262_144) -> LogChunk:
        command = remote_commands.read_log_chunk(path, offset, max_bytes)
        return _log_chunk(_checked(command, self._run(command)))

    def tail_log(self, path: str, lines: int = 40) -> str:
        command = remote_commands.tail_lines(path, lines)
        return self._run(command).stdout

    # ------------------------------------------------------------------------------ async

    async def _arun(self, command: remote_commands.RemoteCommand, conn: asyncssh.SSHClientConnection | None):
        return await self.head_node_hook.arun(command, conn=conn)

    async def asinfo(self, partition: str | None = None, *, conn=None) -> list[parse.NodeStatus]:
        command = remote_commands.sinfo(partition)
        return parse.parse_sinfo(_checked(command, await self._arun(command, conn)).stdout)

    async def ascontrol_show_job(self, job_id: str, *, conn=None) -> JobStatus | None:
        return _status_from_scontrol(job_id, await self._arun(remote_commands.scontrol_show_job(job_id), conn))

    async def ascancel(self, job_id: str, *, conn=None) -> None:
        command = remote_commands.scancel(job_id)
        _checked(command, await self._arun(command, conn))

    async def ajob_status(self, job_id: str, job_dir: str, *, conn=None) -> JobStatus:
        status = await self.ascontrol_show_job(job_id, conn=conn)
        if status is None:
            status = _status_from_sacct(job_id, await self._arun(remote_commands.sacct_job(job_id), conn))
        if status is None:
            marker = remote_commands.job_exit_marker_path(job_dir, job_id)
            status = _status_from_exit_marker(job_id, await self._arun(remote_commands.read_file(marker, 64), conn))
        return status

    async def aread_log_chunk(self, path: str, offset: int, max_bytes: int = 262_144, *, conn=None) -> LogChunk:
        command = remote_commands.read_log_chunk(path, offset, max_bytes)
        return _log_chunk(_checked(command, await self._arun(command, conn)))
