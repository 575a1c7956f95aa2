"""Every shell command ultracluster runs on the head node is built here.

Rules this module keeps so callers cannot get them wrong:
- every interpolated value goes through ``shlex.quote`` (or is validated to a strict pattern first);
- secrets (presigned URLs) never appear in a command line: they travel on the command's stdin as a
  curl config (``curl -K -``), so they are not in ``ps`` on the head node, in logs or in XCom;
- ``str(command)`` is a short safe description, the text that is actually run is ``command.shell``.
Only the stdlib is imported: the DAG file imports operators that import this module at parse time.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Output formats the parsers in ultracluster.parsers.slurm expect. Free text (reason, comment) is
# kept in the last column so a "|" inside it cannot shift the other columns.
SINFO_FORMAT = "%P|%a|%D|%T|%N|%E"
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%k"

# Slurm job states squeue is asked about when looking for a job to reattach to.
_ALL_STATES = "all"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")
_JOB_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
JOB_NAME_MAX = 120


@dataclass(frozen=True)
class RemoteCommand:
    """A command for the head node's login shell.

    ``shell`` is the exact text run; ``stdin`` carries data (possibly secret) written to the
    command's standard input.
    """

    shell: str
    description: str
    stdin: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.description


def _from_argv(*argv: str, description: str | None = None) -> RemoteCommand:
    shell = shlex.join(str(word) for word in argv)
    return RemoteCommand(shell=shell, description=description or shell)


def _check_job_id(job_id: str | int) -> str:
    text = str(job_id)
    if not _JOB_ID.match(text):
        raise ValueError(f"Not a Slurm job id: {text!r}")
    return text


def _env_words(env: Mapping[str, str]) -> list[str]:
    """``env NAME=value ...`` (checked names and values) to put before a command; none for no env."""
    assignments: list[str] = []
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"Invalid environment variable name for the job: {name!r}")
        if "\n" in str(value) or "\x00" in str(value):
            raise ValueError(f"Environment variable {name} holds a newline or NUL byte")
        assignments.append(f"{name}={value}")
    return ["env", *assignments] if assignments else []


def slurm_job_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1, label: str | None = None) -> str:
    """Deterministic, shell- and Slurm-safe job name for one task of one run.

    The readable part is sanitised and cut; the hash of the exact ids keeps two runs (or two
    tasks) whose ids sanitise to the same text apart, so reattach never picks another run's job.
    """
    identity = f"{dag_id}\x1f{run_id}\x1f{task_id}\x1f{map_index}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    readable = _JOB_NAME_UNSAFE.sub("_", label or f"{dag_id}.{task_id}").strip("._-") or "task"
    readable = readable[: JOB_NAME_MAX - len(digest) - 4]
    return f"uc.{readable}.{digest}"


# ----------------------------------------------------------------------------------------- Slurm


def sinfo(partition: str | None = None) -> RemoteCommand:
    """One line per node and partition: partition|avail|count|state|node|reason."""
    argv = ["sinfo", "--noheader", "--Node", "--format", SINFO_FORMAT]
    if partition:
        argv += ["--partition", partition]
    return _from_argv(*argv)


def squeue_by_name(job_name: str) -> RemoteCommand:
    """Live and recently finished (still in slurmctld memory) jobs with this exact name."""
    return _from_argv("squeue", "--noheader", "--states", _ALL_STATES, "--name", job_name, "--format", SQUEUE_FORMAT)


def squeue_job(job_id: str | int) -> RemoteCommand:
    """The job with this id (live or recently finished): its name and comment say whose it is."""
    return _from_argv(
        "squeue", "--noheader", "--states", _ALL_STATES, "--jobs", _check_job_id(job_id), "--format", SQUEUE_FORMAT
    )


def scontrol_show_job(job_id: str | int) -> RemoteCommand:
    # The one-line form keeps the parse simple; the parser accepts both forms anyway.
    return _from_argv("scontrol", "--oneliner", "show", "job", _check_job_id(job_id))


def sacct_job(job_id: str | int, job_name: str | None = None) -> RemoteCommand:
    """Final state from accounting; fails with "accounting storage is disabled" without slurmdbd.

    With ``job_name`` only a job of that id AND name is listed (a rebuilt cluster reuses ids).
    """
    argv = ["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", _check_job_id(job_id)]
    if job_name:
        argv += ["--name", job_name]
    return _from_argv(*argv, "--format", "JobID,JobName,State,ExitCode")


def scancel(job_id: str | int) -> RemoteCommand:
    return _from_argv("scancel", _check_job_id(job_id))


# The job's files next to each other in its directory: the Slurm log (out), srun's exit code (exit)
# and the job's name (name), written by the job sbatch() builds.
_JOB_FILE = "{job_dir}/slurm-{job_id}.{kind}"


def job_file(job_dir: str, job_id: str | int, kind: str) -> str:
    return _JOB_FILE.format(job_dir=job_dir.rstrip("/"), job_id=_check_job_id(job_id), kind=kind)


def sbatch(
    *,
    job_dir: str,
    script_path: str,
    num_nodes: int,
    job_name: str,
    comment: str,
    job_env: Mapping[str, str],
    launcher: str | None = None,
    launcher_fallback_env: Mapping[str, str] | None = None,
    partition: str | None = None,
    exclusive: bool = True,
    time_limit_minutes: int | None = None,
) -> RemoteCommand:
    """``sbatch --exclusive --nodes N --wrap "srun [launcher] script"`` from the job directory.

    The job environment is set with ``env NAME=value sbatch --export ALL``: sbatch hands its own
    environment to the job, and unlike ``--export=ALL,NAME=value`` a value may contain commas.
    When ``launcher`` is given but missing on the batch node (``command -v``), the script runs
    without it and with ``launcher_fallback_env`` added (the script's own compile-only mode).
    The wrap records the job name (``slurm-<jobid>.name``) and srun's exit code
    (``slurm-<jobid>.exit``) next to the Slurm log so the final state, and whose job it was, are
    known even after slurmctld forgot the job and there is no accounting.
    """
    if int(num_nodes) < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    env_words = _env_words(job_env)
    fallback_env_words = _env_words(launcher_fallback_env or {})
    run = shlex.join(["srun", script_path])
    if launcher:
        srun_launcher = shlex.join(["srun", launcher, script_path])
        fallback = shlex.join([*fallback_env_words, "srun", script_path])
        run = (
            f"if command -v {shlex.quote(launcher)} >/dev/null 2>&1; then {srun_launcher}; "
            f"else echo {shlex.quote(f'UC_INFO {launcher} not found, running compile-only mode')}; "
            f"{fallback}; fi"
        )
    # The batch shell fills in the id; the name tells whose exit marker it is once job ids repeat
    # (a rebuilt cluster restarts at 1).
    exit_marker, name_marker = (
        _JOB_FILE.format(job_dir=shlex.quote(job_dir.rstrip("/")), job_id='"$SLURM_JOB_ID"', kind=kind)
        for kind in ("exit", "name")
    )
    wrap = f'echo {shlex.quote(job_name)} > {name_marker}; {run}; rc=$?; echo "$rc" > {exit_marker}; exit "$rc"'
    argv = [
        "sbatch", "--parsable", "--job-name", job_name, "--comment", comment, "--nodes", str(int(num_nodes)),
        "--chdir", job_dir, "--output", _JOB_FILE.format(job_dir=job_dir.rstrip("/"), job_id="%j", kind="out"),
        "--export", "ALL",
        # Airflow owns retries: a job Slurm silently requeued after a node failure would rerun
        # from scratch behind the task's back and hide NODE_FAIL.
        "--no-requeue",
    ]
    if exclusive:
        argv.append("--exclusive")
    if partition:
        argv += ["--partition", partition]
    if time_limit_minutes:
        argv += ["--time", str(int(time_limit_minutes))]
    argv += ["--wrap", wrap]
    shell = shlex.join([*env_words, *argv])
    return RemoteCommand(shell=shell, description=f"sbatch --job-name {job_name} --nodes {num_nodes} ({script_path})")


# ------------------------------------------------------------------------------------- files


def make_dirs(*paths: str) -> RemoteCommand:
    return _from_argv("mkdir", "-p", "--", *paths)


def read_file(path: str, max_bytes: int = 1_000_000) -> RemoteCommand:
    """The file's content, or empty output (exit 0) when it does not exist."""
    quoted = shlex.quote(path)
    return RemoteCommand(
        shell=f"if [ -f {quoted} ]; then head -c {int(max_bytes)} -- {quoted}; fi",
        description=f"read {path}",
    )


def read_log_chunk(path: str, offset: int, max_bytes: int = 262_144) -> RemoteCommand:
    """File size on the first line, then up to max_bytes from byte offset, base64 on one line.

    base64 keeps byte offsets exact whatever the log's encoding; a missing log prints size -1.
    """
    quoted = shlex.quote(path)
    start = int(offset) + 1  # tail -c +N is 1-based
    return RemoteCommand(
        shell=(
            f"if [ -f {quoted} ]; then stat -c %s -- {quoted}; "
            f"tail -c +{start} -- {quoted} | head -c {int(max_bytes)} | base64 -w0; echo; "
            f"else echo -1; fi"
        ),
        description=f"read {path} from byte {int(offset)}",
    )


def tail_lines(path: str, lines: int = 40) -> RemoteCommand:
    quoted = shlex.quote(path)
    return RemoteCommand(
        shell=f"if [ -f {quoted} ]; then tail -n {int(lines)} -- {quoted}; fi",
        description=f"tail -n {int(lines)} {path}",
    )


def list_files(directory: str, max_depth: int = 4) -> RemoteCommand:
    """``<size> <path relative to directory>`` per regular file, or nothing if it is missing."""
    quoted = shlex.quote(directory)
    return RemoteCommand(
        shell=(
            f"if [ -d {quoted} ]; then find {quoted} -maxdepth {int(max_depth)} -type f "
            f"-printf '%s %P\\n' | LC_ALL=C sort -k2; fi"
        ),
        description=f"list files under {directory}",
    )


def write_file(path: str, content: str) -> RemoteCommand:
    """Atomically replace a small text file (content on stdin, never in the command line)."""
    quoted, tmp = shlex.quote(path), shlex.quote(path + ".tmp")
    return RemoteCommand(
        shell=f"cat > {tmp} && mv -f -- {tmp} {quoted}",
        description=f"write {path}",
        stdin=content,
    )


# ----------------------------------------------------------------------------------- dataset


def _curl_config(entries: Iterable[tuple[str, str]]) -> str:
    """curl ``-K`` config text; values double-quoted with curl's escaping rules."""

    def quote(value: str) -> str:
        if any(c in value for c in "\n\r\x00"):
            raise ValueError("curl config values cannot hold newlines")
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "".join(f"{key} = {quote(value)}\n" for key, value in entries)


def cancellable(command: RemoteCommand, pid_file: str) -> RemoteCommand:
    """Run ``command`` in its own process group whose id goes to ``pid_file``; exit with its status.

    Closing an SSH channel does not stop a remote curl writing to a file, so a killed task could not
    stop it; ``kill_process_group(pid_file)`` can. ``setsid`` does not fork here (a background job
    of a non-interactive shell is no group leader), so the recorded pid is the group id. ``<&0``
    keeps the command's stdin (the secret curl config) instead of bash's /dev/null for ``&``.
    """
    pid = shlex.quote(pid_file)
    return RemoteCommand(
        shell=(
            f'setsid bash -c {shlex.quote(command.shell)} <&0 & pid=$!; echo "$pid" > {pid}; '
            f'wait "$pid"; rc=$?; rm -f -- {pid}; exit "$rc"'
        ),
        description=f"{command.description} (cancellable)",
        stdin=command.stdin,
    )


def kill_process_group(pid_file: str, grace_seconds: int = 5) -> RemoteCommand:
    """Stop what ``cancellable`` started: TERM to its whole process group, KILL what is left after
    ``grace_seconds``; a no-op when it is gone. Returns once the group is gone (or KILLed), so a
    new transfer started next cannot share the old one's .part file with it."""
    pid = shlex.quote(pid_file)
    ticks = int(grace_seconds) * 10
    return RemoteCommand(
        shell=(
            f'if [ -f {pid} ]; then p=$(cat {pid}); case "$p" in (*[!0-9]*|"") exit 0;; '
            # kill -- -0 signals our own group and -1 every process: a corrupt pid file must not.
            f'(0*|1) echo "refusing to signal process group $p from {pid_file}" >&2; exit 1;; esac; '
            f'kill -TERM -- "-$p" 2>/dev/null; i=0; '
            f'while [ "$i" -lt {ticks} ] && kill -0 -- "-$p" 2>/dev/null; do sleep 0.1; i=$((i+1)); done; '
            f'kill -KILL -- "-$p" 2>/dev/null; rm -f -- {pid}; fi; exit 0'
        ),
        description=f"stop the process group in {pid_file}",
    )


def download_to_file(presigned_url: str, destination: str) -> RemoteCommand:
    """curl the (secret) URL, given on stdin, to destination via a .part file and rename.

    The rename makes a half-finished download invisible: a retry starts it again from scratch.
    """
    dest, part = shlex.quote(destination), shlex.quote(destination + ".part")
    directory = shlex.quote(destination.rsplit("/", 1)[0] or "/")
    return RemoteCommand(
        shell=(
            f"mkdir -p -- {directory} && "
            f"curl --fail --silent --show-error --location --retry 5 --retry-delay 2 "
            f"--output {part} --config - && mv -f -- {part} {dest}"
        ),
        description=f"download dataset to {destination}",
        stdin=_curl_config([("url", presigned_url)]),
    )


def sha256_of(path: str) -> RemoteCommand:
    return _from_argv("sha256sum", "--", path)


def unpack_tar(tar_path: str, destination_dir: str) -> RemoteCommand:
    return _from_argv("tar", "-x", "-f", tar_path, "-C", destination_dir, "--no-same-owner",
                      description=f"unpack {tar_path} into {destination_dir}")


def count_files(directory: str, pattern: str) -> RemoteCommand:
    quoted = shlex.quote(directory)
    return RemoteCommand(
        shell=f"find {quoted} -maxdepth 1 -type f -name {shlex.quote(pattern)} | wc -l",
        description=f"count {pattern} in {directory}",
    )


# Manifest names looked for in the unpacked dataset directory, with the tool that checks them.
CHECKSUM_MANIFESTS: tuple[tuple[str, str], ...] = (
    ("SHA256SUMS", "sha256sum"),
    ("sha256sums.txt", "sha256sum"),
    ("MD5SUMS", "md5sum"),
    ("md5sums.txt", "md5sum"),
)


def verify_checksum_manifest(directory: str) -> RemoteCommand:
    """Check the first manifest present; prints ``NO_MANIFEST`` and exits 0 when there is none."""
    quoted = shlex.quote(directory)
    branches = " ".join(
        f"if [ -f {shlex.quote(name)} ]; then echo MANIFEST {shlex.quote(name)}; "
        f"{tool} --check --quiet --strict -- {shlex.quote(name)}; exit $?; fi;"
        for name, tool in CHECKSUM_MANIFESTS
    )
    return RemoteCommand(
        shell=f"cd -- {quoted} && {{ {branches} echo NO_MANIFEST; }}",
        description=f"verify checksum manifest in {directory}",
    )


def remove_files(*paths: str) -> RemoteCommand:
    return _from_argv("rm", "-f", "--", *paths)


# ---------------------------------------------------------------------------------- artifacts


def upload_files(uploads: Sequence[tuple[str, str]]) -> RemoteCommand:
    """PUT each local (head-node) file to its presigned URL with one curl; URLs go on stdin.

    Data goes head node -> S3 directly: checkpoints can be large and must not travel through the
    Airflow worker.
    """
    if not uploads:
        raise ValueError("Nothing to upload")
    entries: list[tuple[str, str]] = []
    for local_path, url in uploads:
        entries += [("upload-file", local_path), ("url", url)]
    return RemoteCommand(
        shell="curl --fail --fail-early --silent --show-error --retry 5 --retry-delay 2 --config -",
        description=f"upload {len(uploads)} file(s) with presigned URLs",
        stdin=_curl_config(entries),
    )
