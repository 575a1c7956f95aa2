"""Slurm on the head node: thin wrappers named after the Slurm commands they run.

Commands come from ``ultracluster.remote_commands``, parses from ``ultracluster.parsers.slurm``;
this module only runs them through ``HeadNodeHook`` (sync) or its asyncssh path (async).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from ultracluster import remote_commands
from ultracluster.hooks.head_node import DEFAULT_SSH_CONN_ID, CommandResult, HeadNodeHook, HeadNodeUnreachableError
from ultracluster.parsers import slurm as parse
from ultracluster.parsers.files import LogChunk, parse_log_chunk
from ultracluster.run.states import JOB_SUCCESS_STATES, JOB_TERMINAL_STATES, JOB_UNKNOWN

if TYPE_CHECKING:
    import asyncssh


# The longest a head-node wait command runs before its trigger checks for itself (the job's status, the
# cluster's describe-cluster) and starts another on the same connection.
WAIT_WINDOW_S = 300


class SlurmCommandError(RuntimeError):
    """A Slurm command failed on the head node."""


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands, from the best source still available."""

    job_id: str
    state: str  # Slurm base state, or JOB_UNKNOWN when no source knows the job any more
    exit_code: int | None
    signal: int | None
    reason: str | None
    source: str  # "scontrol", "sacct" or "exit_marker"
    name: str | None = None  # the job name, when the source reports it
    nodes: str | None = None  # the job's NodeList (a Slurm hostlist), when the source reports it

    @property
    def terminal(self) -> bool:
        return self.state in JOB_TERMINAL_STATES or self.state == JOB_UNKNOWN

    @property
    def succeeded(self) -> bool:
        return self.state in JOB_SUCCESS_STATES

    def to_dict(self) -> dict[str, Any]:
        """An event's fields about the job's end (``job_reason``: an event's ``reason`` is its code)."""
        return {
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "job_reason": self.reason,
            "source": self.source,
            "nodes": self.nodes,
        }


def _checked(command: remote_commands.RemoteCommand, result: CommandResult) -> CommandResult:
    if not result.ok:
        raise SlurmCommandError(
            f"`{command}` failed (exit {result.exit_status}): {(result.stderr or result.stdout).strip()[:2000]}"
        )
    return result


def status_from_scontrol(job_id: str, result: CommandResult) -> JobStatus | None:
    if not result.ok:
        if parse.is_unknown_job_error(result.stderr):
            return None
        raise SlurmCommandError(f"scontrol show job {job_id} failed: {result.stderr.strip()[:2000]}")
    info = parse.parse_scontrol_show_job(result.stdout)
    return JobStatus(info.job_id, info.state, info.exit_code, info.signal, info.reason, "scontrol", info.name,
                     info.nodes)


def status_from_sacct(job_id: str, result: CommandResult, job_name: str | None = None) -> JobStatus | None:
    """``job_name``: the sacct command filtered on it, so a row found is a job of that name."""
    if not result.ok or parse.is_accounting_disabled(result.stdout + result.stderr):
        return None
    parsed = parse.parse_sacct(result.stdout, job_id)
    if parsed is None:
        return None
    state, exit_code, signal, nodes = parsed
    return JobStatus(job_id, state, exit_code, signal, None, "sacct", job_name, nodes)


def status_from_exit_marker(job_id: str, result: CommandResult) -> JobStatus:
    code = parse.parse_exit_marker(result.stdout) if result.ok else None
    if code is not None:
        return JobStatus(job_id, "COMPLETED" if code == 0 else "FAILED", code, 0, "from exit marker", "exit_marker")
    return JobStatus(
        job_id,
        JOB_UNKNOWN,
        None,
        None,
        "slurmctld no longer knows the job (MinJobAge), there is no accounting and no exit marker",
        "exit_marker",
    )


# A status decision: yields the commands it needs, receives their results, returns the status.
# The sync and async hooks drive the same one, so the two paths cannot drift apart.
StatusPlan = Generator[remote_commands.RemoteCommand, CommandResult, JobStatus]


def _job_status_plan(job_id: str, job_dir: str, job_name: str | None) -> StatusPlan:
    """scontrol, then sacct (when accounting exists), then the job's exit marker file.

    ``job_name`` restricts sacct to a job of that name, and reads the name the job recorded next
    to its exit marker; the status then carries the name (a rebuilt cluster reuses job ids).
    """
    status = status_from_scontrol(job_id, (yield remote_commands.scontrol_show_job(job_id)))
    if status is None:
        status = status_from_sacct(job_id, (yield remote_commands.sacct_job(job_id, job_name)), job_name)
    if status is None:
        marker = yield remote_commands.read_file(remote_commands.job_file(job_dir, job_id, "exit"), 64)
        status = status_from_exit_marker(job_id, marker)
        if job_name is not None and status.state != JOB_UNKNOWN:
            name = yield remote_commands.read_file(remote_commands.job_file(job_dir, job_id, "name"), 1024)
            status = dataclasses.replace(status, name=name.stdout.strip() or None)
    return status


def _drive(plan: StatusPlan, run: Callable[[remote_commands.RemoteCommand], CommandResult]) -> JobStatus:
    try:
        command = next(plan)
        while True:
            command = plan.send(run(command))
    except StopIteration as done:
        return done.value


async def _adrive(
    plan: StatusPlan, arun: Callable[[remote_commands.RemoteCommand], Awaitable[CommandResult]]
) -> JobStatus:
    try:
        command = next(plan)
        while True:
            command = plan.send(await arun(command))
    except StopIteration as done:
        return done.value


def _job_end_commands(job_dir: str, job_id: str, results_path: str, *, health_gate: bool,
                      launcher: bool) -> dict[str, remote_commands.RemoteCommand]:
    """What a succeeded job's task reads (``parsers.job_end``): the gate's report, the launch marker,
    results.json; none for a plain job."""
    commands = {}
    if health_gate:
        commands["health"] = remote_commands.read_file(remote_commands.job_file(job_dir, job_id, "health"))
    if launcher:
        commands["launch"] = remote_commands.tail_lines(remote_commands.job_file(job_dir, job_id, "launch"), 5)
        commands["results"] = remote_commands.read_file(results_path)
    return commands


def _log_chunk(command: remote_commands.RemoteCommand, result: CommandResult) -> LogChunk:
    try:
        return parse_log_chunk(_checked(command, result).stdout)
    except ValueError as err:
        raise SlurmCommandError(str(err)) from None


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

    def sinfo(self, partition: str | None = None, nodes: str | None = None) -> list[parse.NodeStatus]:
        command = remote_commands.sinfo(partition, nodes)
        return parse.parse_sinfo(_checked(command, self._run(command)).stdout)

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

    def drain(self, nodes: list[str], reason: str) -> None:
        """``scontrol update ... State=DRAIN Reason=<reason>`` (raises SlurmCommandError when refused)."""
        command = remote_commands.drain_nodes(nodes, reason)
        _checked(command, self._run(command))

    def health_report(self, job_dir: str, job_id: str) -> str:
        """The node health gate's report of a job (``run.health.parse_report`` reads it); empty if none."""
        command = remote_commands.read_file(remote_commands.job_file(job_dir, job_id, "health"))
        return _checked(command, self._run(command)).stdout

    def sacct_usage(self, job_names: list[str], since_day: str) -> list[dict[str, Any]] | None:
        """The allocations of jobs of these names (``parse.parse_sacct_usage``); None when the cluster
        has no accounting (no slurmdbd)."""
        command = remote_commands.sacct_usage(job_names, since_day)
        result = self._run(command)
        if parse.is_accounting_disabled(result.stdout + result.stderr):
            return None
        return parse.parse_sacct_usage(_checked(command, result).stdout)

    def job_status(self, job_id: str, job_dir: str, *, job_name: str | None = None) -> JobStatus:
        """Where the job stands (``_job_status_plan``)."""
        return _drive(_job_status_plan(job_id, job_dir, job_name), self._run)

    def read_log_chunk(self, path: str, offset: int, max_bytes: int = 262_144) -> LogChunk:
        command = remote_commands.read_log_chunk(path, offset, max_bytes)
        return _log_chunk(command, self._run(command))

    def tail_log(self, path: str, lines: int = 40) -> str:
        command = remote_commands.tail_lines(path, lines)
        return self._run(command).stdout

    def job_end_files(self, job_dir: str, job_id: str, results_path: str, *, health_gate: bool,
                      launcher: bool) -> dict[str, str | Exception]:
        """The files a succeeded job left for its task (``parsers.job_end.job_end_extras`` reads them):
        name -> text, or the error that kept it unread."""
        files: dict[str, str | Exception] = {}
        for name, command in _job_end_commands(job_dir, job_id, results_path, health_gate=health_gate,
                                               launcher=launcher).items():
            try:
                files[name] = _checked(command, self._run(command)).stdout
            except (HeadNodeUnreachableError, SlurmCommandError) as err:
                files[name] = err
        return files

    # ------------------------------------------------------------------------------ async

    async def _arun(self, command: remote_commands.RemoteCommand, conn: asyncssh.SSHClientConnection | None):
        return await self.head_node_hook.arun(command, conn=conn)

    async def asinfo_text(self, partition: str | None = None, *, conn=None) -> str:
        """``sinfo``'s own text (``parsers.slurm.parse_sinfo`` reads it; ``await_nodes_change`` waits
        for it to change)."""
        command = remote_commands.sinfo(partition)
        return _checked(command, await self._arun(command, conn)).stdout

    async def ascancel(self, job_id: str, *, conn=None) -> None:
        command = remote_commands.scancel(job_id)
        _checked(command, await self._arun(command, conn))

    async def ajob_status(self, job_id: str, job_dir: str, *, job_name: str | None = None, conn=None) -> JobStatus:
        """``job_status`` over ``conn`` (one connection for a trigger's whole wait)."""
        return await _adrive(_job_status_plan(job_id, job_dir, job_name), lambda command: self._arun(command, conn))

    async def aread_log_chunk(self, path: str, offset: int, max_bytes: int = 262_144, *, conn=None) -> LogChunk:
        command = remote_commands.read_log_chunk(path, offset, max_bytes)
        return _log_chunk(command, await self._arun(command, conn))

    async def ajob_end_files(self, job_dir: str, job_id: str, results_path: str, *, health_gate: bool,
                             launcher: bool, conn=None) -> dict[str, str | Exception]:
        """``job_end_files`` over ``conn``."""
        files: dict[str, str | Exception] = {}
        for name, command in _job_end_commands(job_dir, job_id, results_path, health_gate=health_gate,
                                               launcher=launcher).items():
            try:
                files[name] = _checked(command, await self._arun(command, conn)).stdout
            except (HeadNodeUnreachableError, SlurmCommandError) as err:
                files[name] = err
        return files

    async def await_job_end(
        self,
        job_id: str,
        log_path: str,
        log_offset: int,
        on_output: Callable[[bytes], bool],
        *,
        conn: asyncssh.SSHClientConnection,
        interval_s: float = 1.0,
        window_s: int = WAIT_WINDOW_S,
    ) -> parse.WaitEnd:
        """Run ``remote_commands.wait_job_end`` on ``conn``, handing each chunk of the log's new bytes
        to ``on_output`` as it arrives; ``on_output`` returns False to stop the wait early.

        One command per window on the trigger's connection: the job's end reaches the trigger about
        ``interval_s`` after Slurm records it, without a round trip per check.
        """
        command = remote_commands.wait_job_end(job_id, log_path, log_offset, interval_s=interval_s, window_s=window_s)
        return await self._await_command(command, on_output, conn=conn, window_s=window_s)

    async def await_nodes_change(
        self,
        partition: str | None,
        seen: str,
        *,
        conn: asyncssh.SSHClientConnection,
        interval_s: float = 1.0,
        window_s: int = WAIT_WINDOW_S,
    ) -> str | None:
        """Run ``remote_commands.wait_nodes_change`` on ``conn``: the partition's new ``sinfo`` text
        once it differs from ``seen`` (an ``asinfo_text`` result), or None when the window passed.

        A command that ended without saying why raises HeadNodeUnreachableError.
        """
        command = remote_commands.wait_nodes_change(partition, seen, interval_s=interval_s, window_s=window_s)
        output: list[bytes] = []

        def collect(chunk: bytes) -> bool:
            output.append(chunk)
            return True

        end = await self._await_command(command, collect, conn=conn, window_s=window_s)
        if end.reason == "changed":
            return b"".join(output).decode("utf-8", "replace")
        if end.reason == "window":
            return None
        raise HeadNodeUnreachableError(f"{command} ended without saying why ({end.reason})")

    async def _await_command(
        self,
        command: remote_commands.RemoteCommand,
        on_output: Callable[[bytes], bool],
        *,
        conn: asyncssh.SSHClientConnection,
        window_s: int,
    ) -> parse.WaitEnd:
        """Run one long-lived head-node wait command (``remote_commands.wait``) on ``conn``: its stdout
        goes to ``on_output`` chunk by chunk (False stops it), its last stderr line says why it ended."""
        import asyncssh  # heavy: never at parse time (docs/architecture.md, "Imports")

        try:
            process = await conn.create_process(command.shell, encoding=None)
            if command.stdin is not None:
                process.stdin.write(command.stdin.encode())
                process.stdin.write_eof()
        except (OSError, asyncssh.Error) as err:
            raise HeadNodeUnreachableError(f"Lost the head node starting {command}: {err!r}") from err
        stopped = False
        try:
            async with asyncio.timeout(window_s + 120):  # a hung command cannot hold the trigger forever
                while chunk := await process.stdout.read(65_536):
                    if not on_output(chunk):
                        stopped = True
                        break
                if stopped:
                    return parse.WaitEnd("stopped")
                stderr = await process.stderr.read()
                await process.wait()
        except (TimeoutError, OSError, asyncssh.Error) as err:
            raise HeadNodeUnreachableError(f"Lost the head node during {command}: {err!r}") from err
        finally:
            if stopped or process.exit_status is None:
                process.close()
        return parse.parse_wait_end(stderr.decode("utf-8", "replace"), remote_commands.WAIT_END_MARKER)
