"""Every parse of Slurm output (sinfo, squeue, scontrol show job, sbatch, sacct). Formats match
``ultracluster.remote_commands``; the training job's own lines are parsed in ``parsers.progress``.

Tested against real Slurm 22.05.8 output in tests/fixtures/slurm/. The job states and their
verdicts are ``run.states``', the fleet's capacity rules ``run.fleet``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ultracluster.run.states import JOB_SUCCESS_STATES, JOB_TERMINAL_STATES, base_state


class SlurmParseError(ValueError):
    """Slurm printed something the parser does not understand."""


# ------------------------------------------------------------------------------------ sbatch

_SBATCH_PARSABLE = re.compile(r"^\s*(\d+)(?:;[^\s]+)?\s*$")
_SBATCH_TEXT = re.compile(r"Submitted batch job (\d+)")


def parse_sbatch(stdout: str) -> str:
    """Job id from ``sbatch --parsable`` (``123`` or ``123;cluster``) or the plain message."""
    for line in stdout.splitlines():
        if match := _SBATCH_PARSABLE.match(line) or _SBATCH_TEXT.search(line):
            return match.group(1)
    raise SlurmParseError(f"No job id in sbatch output: {stdout.strip()[:200]!r}")


# ------------------------------------------------------------------------------------- sinfo

# sinfo state suffixes: * not responding, ~ powered off, # powering up, % powering down,
# ! pending power down, $ maintenance, @ pending reboot, ^ rebooting, - planned.
_NODE_FLAGS = "*~#%!$@^-"
# Reasons of a node whose launch or bootstrap failed, whatever state it shows meanwhile (down#, down~,
# idle%, idle~): ParallelCluster's resume and clustermgtd ("(Code:InsufficientInstanceCapacity)Failure
# when resuming nodes", "(Code:...)Temporarily disabling node due to insufficient capacity", "Scheduler
# health check failed", "Static node maintenance: unhealthy node is being replaced") and Slurm's own
# ("ResumeTimeout reached": the node never registered).
_POWER_UP_FAILURE = re.compile(
    r"\(Code:\w+\)|Failure when resuming nodes|ResumeTimeout reached|Scheduler health check failed|"
    r"Static node maintenance|bootstrap fail", re.IGNORECASE)


@dataclass(frozen=True)
class NodeStatus:
    partition: str
    available: str
    name: str
    state: str  # full sinfo state, e.g. "idle~", "down*", "drained"
    reason: str | None
    default_partition: bool = False

    @property
    def base(self) -> str:
        return self.state.rstrip(_NODE_FLAGS).lower()

    @property
    def flags(self) -> str:
        return self.state[len(self.state.rstrip(_NODE_FLAGS)) :]

    @property
    def powered_down(self) -> bool:
        return "~" in self.flags

    @property
    def not_responding(self) -> bool:
        return "*" in self.flags

    @property
    def is_idle_ready(self) -> bool:
        """Idle and powered up: a static node ready now."""
        return self.base == "idle" and not self.flags

    @property
    def is_idle_powered_down(self) -> bool:
        """A dynamic node Slurm will power up for a job (``idle~``)."""
        return self.base == "idle" and self.flags == "~"

    @property
    def failure_reported(self) -> bool:
        """The node's reason is a launch or bootstrap failure (it may linger once the node is replaced)."""
        return bool(self.reason and _POWER_UP_FAILURE.search(self.reason))

    @property
    def power_up_failed(self) -> bool:
        """A launch or bootstrap failure still on the node: down, drained or powering down. Back at
        ``idle~`` it is replaced (a new instance at the next power-up), whatever reason lingers."""
        return self.failure_reported and (self.is_unusable or "%" in self.flags or "!" in self.flags)

    @property
    def is_unusable(self) -> bool:
        """Down, drained/draining, failing or not responding: a job cannot get it."""
        return self.base.startswith(("down", "drain", "fail", "inval", "unk")) or self.not_responding


def parse_sinfo(stdout: str) -> list[NodeStatus]:
    """Lines of ``sinfo -h -N -o '%P|%a|%D|%T|%N|%E'``."""
    nodes: list[NodeStatus] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 5)
        if len(parts) != 6:
            raise SlurmParseError(f"Unexpected sinfo line: {line!r}")
        partition, available, _count, state, name, reason = parts
        reason = reason.strip()
        nodes.append(
            NodeStatus(
                partition=partition.rstrip("*"),
                available=available,
                name=name,
                state=state,
                reason=None if reason in ("", "none", "(null)") else reason,
                default_partition=partition.endswith("*"),
            )
        )
    return nodes


# ------------------------------------------------------------------------------------ squeue


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    name: str
    state: str
    reason: str | None
    nodes: str
    comment: str | None


def parse_squeue(stdout: str) -> list[QueuedJob]:
    """Lines of ``squeue -h -o '%i|%j|%T|%r|%N|%k'``."""
    jobs: list[QueuedJob] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 5)
        if len(parts) != 6:
            raise SlurmParseError(f"Unexpected squeue line: {line!r}")
        job_id, name, state, reason, nodes, comment = parts
        jobs.append(
            QueuedJob(
                job_id=job_id.strip(),
                name=name,
                state=base_state(state),
                reason=None if reason in ("None", "(null)", "") else reason,
                nodes=nodes,
                comment=None if comment in ("(null)", "") else comment,
            )
        )
    return jobs


# ----------------------------------------------------------------------------------- scontrol

# A key starts a token: word chars plus the few punctuation marks scontrol uses in keys
# ("AllocNode:Sid", "CPUs/Task", "ReqB:S:C:T", "NtasksPerN:B:S:C", "Socks/Node").
# Slurm's keys are CamelCase; a lower-case word= inside a value (our Comment "ultracluster run_id=...") is not a key.
_SCONTROL_KEY = re.compile(r"(?:(?<=\s)|^)([A-Z][A-Za-z0-9_:/]*)=")


def parse_scontrol_kv(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of ``scontrol show job`` (one-line or multi-line form).

    Values may hold spaces (``Reason=... ``, ``Comment=...``): a value runs until the next key.
    """
    flat = " ".join(text.split("\n"))
    matches = list(_SCONTROL_KEY.finditer(flat))
    pairs: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(flat)
        pairs.setdefault(match.group(1), flat[match.end() : end].strip())
    return pairs


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    state: str
    reason: str | None
    exit_code: int | None  # the job's exit status (first half of ExitCode=a:b)
    signal: int | None  # the signal that ended it (second half), 0 when none
    nodes: str | None
    num_nodes: int | None
    stdout_path: str | None
    comment: str | None
    work_dir: str | None
    raw: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def terminal(self) -> bool:
        return self.state in JOB_TERMINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state in JOB_SUCCESS_STATES


def _null(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "None", "N/A") else value


def _exit_code(value: str | None) -> tuple[int | None, int | None]:
    if not value or ":" not in value:
        return None, None
    status, signal = value.split(":", 1)
    try:
        return int(status), int(signal)
    except ValueError:
        return None, None


def parse_scontrol_show_job(stdout: str) -> JobInfo:
    pairs = parse_scontrol_kv(stdout)
    if "JobId" not in pairs or "JobState" not in pairs:
        raise SlurmParseError(f"Not a scontrol show job record: {stdout.strip()[:200]!r}")
    status, signal = _exit_code(pairs.get("ExitCode"))
    num_nodes = pairs.get("NumNodes", "").split("-", 1)[0]
    return JobInfo(
        job_id=pairs["JobId"],
        name=pairs.get("JobName", ""),
        state=base_state(pairs["JobState"]),
        reason=_null(pairs.get("Reason")),
        exit_code=status,
        signal=signal,
        nodes=_null(pairs.get("NodeList")),
        num_nodes=int(num_nodes) if num_nodes.isdigit() else None,
        stdout_path=_null(pairs.get("StdOut")),
        comment=_null(pairs.get("Comment")),
        work_dir=_null(pairs.get("WorkDir")),
        raw=pairs,
    )


def is_unknown_job_error(stderr: str) -> bool:
    """slurmctld no longer knows the job (older than MinJobAge, or never existed)."""
    return "Invalid job id specified" in stderr


# -------------------------------------------------------------------------------------- sacct


def is_accounting_disabled(output: str) -> bool:
    return "accounting storage is disabled" in output.lower()


def parse_sacct(stdout: str, job_id: str) -> tuple[str, int | None, int | None, str | None] | None:
    """(state, exit code, signal, node list) of the allocation line of
    ``sacct -n -P -X -o JobID,JobName,State,ExitCode,NodeList``."""
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[0] == str(job_id):
            status, signal = _exit_code(parts[3])
            nodes = _null(parts[4]) if len(parts) > 4 else None
            return base_state(parts[2]), status, signal, None if nodes == "None assigned" else nodes
    return None


def parse_sacct_usage(stdout: str) -> list[dict[str, Any]]:
    """Allocations as ``remote_commands.sacct_usage`` lists them (``JobID|JobName|State|ElapsedRaw|
    NNodes``): ``[{"job_id", "name", "state", "elapsed_s", "nodes"}]``."""
    jobs = []
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5 or not parts[0]:
            continue
        try:
            elapsed, nodes = int(parts[3] or 0), int(parts[4] or 0)
        except ValueError:
            raise SlurmParseError(f"unexpected sacct line: {line!r}") from None
        jobs.append({"job_id": parts[0], "name": parts[1], "state": base_state(parts[2]), "elapsed_s": elapsed,
                     "nodes": nodes})
    return jobs


def parse_exit_marker(text: str) -> int | None:
    """srun's exit code as the batch script wrote it to ``slurm-<id>.exit``; None when absent."""
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else None


@dataclass(frozen=True)
class WaitEnd:
    """Why the head-node wait command (``remote_commands.wait_job_end``) returned."""

    reason: str  # "job-ended", "window", "log-shrank", or "lost" when the command died without saying
    state: str | None = None  # the job's squeue state at the end ("GONE": slurmctld no longer lists it)


def parse_wait_end(stderr: str, marker: str = "UC_WAIT_END") -> WaitEnd:
    for line in reversed(stderr.splitlines()):
        if line.startswith(marker + " "):
            words = line.split()
            return WaitEnd(words[1], words[2] if len(words) > 2 else None)
    return WaitEnd("lost")
