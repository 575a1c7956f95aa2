"""Slurm commands: queries, scancel, and the one place sbatch is built."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence

from ultracluster.remote_commands.command import RemoteCommand, check_job_id, env_words, from_argv
from ultracluster.run.health import HEALTH_GATE_EXIT_CODE, NODES_PREFIX

# Output formats the parsers in ultracluster.parsers.slurm expect. Free text (reason, comment) is
# kept in the last column so a "|" inside it cannot shift the other columns.
SINFO_FORMAT = "%P|%a|%D|%T|%N|%E"
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%k"

# ParallelCluster installs Slurm here and puts its bin/ on PATH only for login shells
# (/etc/profile.d/slurm.sh, from the cookbook); remote commands run in non-login shells and jobs
# inherit sbatch's PATH, so every Slurm command is named in full.
SLURM_BIN = "/opt/slurm/bin"

# Slurm job states squeue is asked about when looking for a job to reattach to.
_ALL_STATES = "all"
# A Slurm node name as ParallelCluster makes them (<queue>-st|dy-<resource>-N); nothing to quote.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# ----------------------------------------------------------------------------------------- Slurm


def slurm_command(name: str) -> str:
    """The absolute path of one of Slurm's commands on a ParallelCluster node."""
    return posixpath.join(SLURM_BIN, name)


def sinfo(partition: str | None = None, nodes: str | None = None) -> RemoteCommand:
    """One line per node and partition: partition|avail|count|state|node|reason; ``nodes``: only
    those (a Slurm hostlist, e.g. a job's NodeList)."""
    argv = [slurm_command("sinfo"), "--noheader", "--Node", "--format", SINFO_FORMAT]
    if partition:
        argv += ["--partition", partition]
    if nodes:
        argv += ["--nodes", nodes]
    return from_argv(*argv)


def squeue_by_name(job_name: str) -> RemoteCommand:
    """Live and recently finished (still in slurmctld memory) jobs with this exact name."""
    return from_argv(
        slurm_command("squeue"), "--noheader", "--states", _ALL_STATES, "--name", job_name, "--format", SQUEUE_FORMAT
    )


def squeue_job(job_id: str | int) -> RemoteCommand:
    """The job with this id (live or recently finished): its name and comment say whose it is."""
    return from_argv(
        slurm_command("squeue"), "--noheader", "--states", _ALL_STATES, "--jobs", check_job_id(job_id),
        "--format", SQUEUE_FORMAT,
    )


def scontrol_show_job(job_id: str | int) -> RemoteCommand:
    # The one-line form keeps the parse simple; the parser accepts both forms anyway.
    return from_argv(slurm_command("scontrol"), "--oneliner", "show", "job", check_job_id(job_id))


def sacct_job(job_id: str | int, job_name: str | None = None) -> RemoteCommand:
    """Final state from accounting; fails with "accounting storage is disabled" without slurmdbd.

    With ``job_name`` only a job of that id AND name is listed (a rebuilt cluster reuses ids).
    """
    argv = [slurm_command("sacct"), "--noheader", "--parsable2", "--allocations", "--jobs", check_job_id(job_id)]
    if job_name:
        argv += ["--name", job_name]
    return from_argv(*argv, "--format", "JobID,JobName,State,ExitCode,NodeList")


# sacct's --starttime: a day in the cluster's own time (no zone needed with a day of margin).
_SACCT_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
SACCT_USAGE_FORMAT = "JobID,JobName,State,ElapsedRaw,NNodes"


def sacct_usage(job_names: Sequence[str], since_day: str) -> RemoteCommand:
    """Every allocation of jobs of these names started since that day (``YYYY-MM-DD``): id|name|
    state|elapsed seconds|nodes. Fails with "accounting storage is disabled" without slurmdbd.
    sacct lists only today's jobs unless told a start."""
    names = [check_job_name(name) for name in job_names]
    if not names:
        raise ValueError("sacct_usage needs at least one job name")
    if not _SACCT_DAY.match(since_day):
        raise ValueError(f"since_day must be YYYY-MM-DD, got {since_day!r}")
    return from_argv(slurm_command("sacct"), "--noheader", "--parsable2", "--allocations", "--name", ",".join(names),
                     "--starttime", since_day, "--format", SACCT_USAGE_FORMAT)


def check_job_name(name: str) -> str:
    """A job name as ``run.names.slurm_job_name`` makes them (no comma: sacct --name splits on it)."""
    if not _NODE_NAME.match(str(name)):
        raise ValueError(f"unexpected Slurm job name {name!r}")
    return str(name)


def scancel(job_id: str | int) -> RemoteCommand:
    return from_argv(slurm_command("scancel"), check_job_id(job_id))


def drain_nodes(nodes: Sequence[str], reason: str) -> RemoteCommand:
    """``scontrol update NodeName=a,b State=DRAIN Reason=...``: no new job lands on the nodes, and
    ParallelCluster's clustermgtd replaces a drained node once it is idle.

    Changing a node's state takes a Slurm operator: ParallelCluster's default user has it through
    passwordless sudo. sudo resets the environment; SLURM_CONF is kept where it is set (ParallelCluster
    sets none: scontrol reads /opt/slurm/etc/slurm.conf).
    """
    if not nodes:
        raise ValueError("drain_nodes needs at least one node")
    for node in nodes:
        if not _NODE_NAME.match(node):
            raise ValueError(f"Not a Slurm node name: {node!r}")
    text = " ".join(str(reason).split())
    if not text:
        raise ValueError("A drain needs a reason")
    return from_argv("sudo", "-n", "--preserve-env=SLURM_CONF", slurm_command("scontrol"), "update",
                     f"NodeName={','.join(nodes)}", "State=DRAIN", f"Reason={text}",
                     description=f"drain {','.join(nodes)} ({text})")


# The job's files next to each other in its directory: the Slurm log (out), srun's exit code (exit)
# and the job's name (name), written by the job sbatch() builds.
_JOB_FILE = "{job_dir}/slurm-{job_id}.{kind}"


def job_file(job_dir: str, job_id: str | int, kind: str) -> str:
    return _JOB_FILE.format(job_dir=job_dir.rstrip("/"), job_id=check_job_id(job_id), kind=kind)


def sbatch(
    *,
    job_dir: str,
    script_path: str,
    num_nodes: int,
    job_name: str,
    comment: str,
    job_env: Mapping[str, str],
    launcher: str | None = None,
    launcher_dirs: Sequence[str] = (),
    launcher_fallback_env: Mapping[str, str] | None = None,
    partition: str | None = None,
    exclusive: bool = True,
    time_limit_minutes: int | None = None,
    health_check: str | None = None,
) -> RemoteCommand:
    """``sbatch --exclusive --nodes N --wrap "srun [launcher] script"`` from the job directory.

    The job environment is set with ``env NAME=value sbatch --export ALL``: sbatch hands its own
    environment to the job, and unlike ``--export=ALL,NAME=value`` a value may contain commas.
    The job's PATH is sbatch's, which lacks the Neuron venv, /opt/aws/neuron/bin and /opt/slurm/bin
    (only a login shell's /etc/profile.d adds them): the wrap puts the absolute ``launcher_dirs`` (the
    training environment's bin/, the Neuron tools) and ``SLURM_BIN`` in front of it, so the run
    script and Neuron's compile wrapper find neuronx-cc and scontrol by name.
    ``launcher`` is resolved on the batch node before srun (with MinCount 0 no compute node exists
    before submission): the first executable ``<dir>/<launcher>`` of ``launcher_dirs``, else PATH.
    The choice is printed as a ``UC_INFO launch``
    line and written to ``slurm-<jobid>.launch``. When it is missing the job prints ``UC_ERROR`` and
    exits 2, unless ``launcher_fallback_env`` is given: then the script runs without it, with that
    env added (the script's compile-only mode; only a profile that says so passes it).
    The wrap records the job name (``slurm-<jobid>.name``) and srun's exit code
    (``slurm-<jobid>.exit``) next to the Slurm log so the final state, and whose job it was, are
    known even after slurmctld forgot the job and there is no accounting.
    ``health_check``: the node health gate's script (``run.health``), run first as one task per node;
    its report goes to ``slurm-<jobid>.health`` (after the allocated node names) and into the Slurm
    log. When it fails the job ends with ``HEALTH_GATE_EXIT_CODE`` before training starts; when it
    passes the training step gets the report's path as ``NODE_HEALTH_REPORT`` (for results.json).
    """
    if int(num_nodes) < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    assignments = env_words(job_env)
    run = shlex.join([slurm_command("srun"), script_path])
    if launcher:
        run = _launch(launcher, launcher_dirs, launcher_fallback_env, script_path, job_dir)
    # The batch shell fills in the id; the name tells whose exit marker it is once job ids repeat
    # (a rebuilt cluster restarts at 1).
    exit_marker, name_marker = (
        _JOB_FILE.format(job_dir=shlex.quote(job_dir.rstrip("/")), job_id='"$SLURM_JOB_ID"', kind=kind)
        for kind in ("exit", "name")
    )
    path_dirs = [d for d in dict.fromkeys([*launcher_dirs, SLURM_BIN]) if d and posixpath.isabs(d)]
    path = f'export PATH={shlex.quote(":".join(path_dirs))}:"$PATH"'
    gate = _health_gate(health_check, job_dir, exit_marker) if health_check else ""
    wrap = (f'{path}; echo {shlex.quote(job_name)} > {name_marker}; {gate}{run}; rc=$?; echo "$rc" > {exit_marker}; '
            'exit "$rc"')
    argv = [
        slurm_command("sbatch"), "--parsable", "--job-name", job_name, "--comment", comment,
        "--nodes", str(int(num_nodes)),
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
    shell = shlex.join([*assignments, *argv])
    return RemoteCommand(shell=shell, description=f"sbatch --job-name {job_name} --nodes {num_nodes} ({script_path})")


def _health_gate(script: str, job_dir: str, exit_marker: str) -> str:
    """The wrap's first step (see sbatch): the gate on every node, its verdict in the job's exit code.

    srun's own failure (a task that could not start) fails the gate too; its tasks run to the end
    (``--kill-on-bad-exit=0``) so that every node reports.
    """
    if not posixpath.isabs(script):
        raise ValueError(f"health_check must be an absolute path, got {script!r}")
    report = _JOB_FILE.format(job_dir=shlex.quote(job_dir.rstrip("/")), job_id='"$SLURM_JOB_ID"', kind="health")
    nodes = f'{shlex.quote(slurm_command("scontrol"))} show hostnames "$SLURM_JOB_NODELIST"'
    srun = shlex.join([slurm_command("srun"), "--ntasks-per-node=1", "--kill-on-bad-exit=0", script])
    code = HEALTH_GATE_EXIT_CODE
    # Unquoted, the substitution's lines become words: one line of node names.
    return (f'echo {NODES_PREFIX.strip()} $({nodes}) > {report}; {srun} >> {report}; hc=$?; cat {report}; '
            f'if [ "$hc" -ne 0 ]; then echo "UC_INFO health gate failed (exit $hc): see "{report}; '
            f'echo {code} > {exit_marker}; exit {code}; fi; '
            f'echo "UC_INFO health gate passed: "{report}; export NODE_HEALTH_REPORT={report}; ')


def _launch(launcher: str, dirs: Sequence[str], fallback_env: Mapping[str, str] | None, script_path: str,
            job_dir: str) -> str:
    """Shell that resolves ``launcher`` on the node and runs ``srun <launcher> <script>`` (see sbatch)."""
    if "/" in launcher or not launcher.strip():
        raise ValueError(f"launcher must be a program name, got {launcher!r}")
    candidates = [posixpath.join(d, launcher) for d in dirs if d and posixpath.isabs(d)]
    marker = _JOB_FILE.format(job_dir=shlex.quote(job_dir.rstrip("/")), job_id='"$SLURM_JOB_ID"', kind="launch")
    where = ", ".join([*dict.fromkeys(posixpath.dirname(c) for c in candidates), "PATH"])
    found = (f'echo "UC_INFO launch mode={launcher} path=$L" | tee {marker}; '
             f'{shlex.quote(slurm_command("srun"))} "$L" {shlex.quote(script_path)}')
    if fallback_env is not None:
        missing = (f"echo {shlex.quote(f'UC_INFO launch mode=compile_only {launcher} not found in {where}')}"
                   f" | tee {marker}; {shlex.join([*env_words(fallback_env), slurm_command('srun'), script_path])}")
    else:
        reason = (f"UC_ERROR {launcher} not found in {where}: install the Neuron tools on the nodes "
                  "or point training_python at the Neuron venv")
        missing = f"echo {shlex.quote(reason)}; (exit 2)"
    return (f"L=; for c in {' '.join(shlex.quote(c) for c in candidates)}; do "
            'if [ -x "$c" ]; then L=$c; break; fi; done; '
            f'[ -n "$L" ] || L=$(command -v {shlex.quote(launcher)} || true); '
            f'if [ -n "$L" ]; then {found}; else {missing}; fi')
