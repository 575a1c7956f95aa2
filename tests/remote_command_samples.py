"""One sample of every command ``ultracluster.remote_commands`` builds, for the tests that hold what
every remote command must do: name Slurm's programs in full (tests/unit/test_remote_command_paths.py)
and run in a head node's non-login shell (tests/integration/test_twin_paths.py, on the twin).

A builder without a sample here fails ``test_every_builder_has_a_sample``: add one."""
from __future__ import annotations

import inspect
from collections.abc import Callable

from ultracluster import remote_commands as rc

# Debian's slurm-client programs, the same set ParallelCluster has in /opt/slurm/bin.
SLURM_PROGRAMS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "sdiag",
                  "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")


def builders() -> dict[str, Callable[..., rc.RemoteCommand]]:
    """Every public function of the package that returns a RemoteCommand (``command.from_argv``, the
    helper they share, builds none of its own)."""
    found = {}
    for name in dir(rc):
        function = getattr(rc, name)
        if (not name.startswith("_") and inspect.isfunction(function)
                and function.__module__.startswith("ultracluster.remote_commands")
                and function.__module__ != "ultracluster.remote_commands.command"
                and inspect.signature(function).return_annotation in ("RemoteCommand", rc.RemoteCommand)):
            found[name] = function
    return found


def samples(job_dir: str, job_id: str = "1", script: str = "/bin/true",
            launcher_dirs: tuple[str, ...] = ()) -> dict[str, list[rc.RemoteCommand]]:
    """Commands a test can run as they are in ``job_dir`` (nothing there needs to exist)."""
    log = f"{job_dir}/slurm-{job_id}.out"
    job = dict(job_dir=job_dir, script_path=script, num_nodes=1, job_name="uc.samples", comment="samples",
               job_env={"SAMPLE": "1"}, exclusive=False)
    return {
        "sinfo": [rc.sinfo(), rc.sinfo("compute1"), rc.sinfo(nodes="compute1-dy-trn1-[1-2]")],
        "squeue_by_name": [rc.squeue_by_name("uc.samples")],
        "squeue_job": [rc.squeue_job(job_id)],
        "scontrol_show_job": [rc.scontrol_show_job(job_id)],
        "sacct_job": [rc.sacct_job(job_id, "uc.samples")],
        "sacct_usage": [rc.sacct_usage(["uc.samples", "uc.samples2"], "2026-12-01")],
        "scancel": [rc.scancel("999999")],
        # A node no cluster has: scontrol refuses it, after sudo and scontrol were found.
        "drain_nodes": [rc.drain_nodes(["uc-samples-none"], "UC samples")],
        "sbatch": [rc.sbatch(**job),
                   rc.sbatch(**job, launcher="neuron_parallel_compile", launcher_dirs=launcher_dirs),
                   rc.sbatch(**job, health_check=script)],
        "wait_job_end": [rc.wait_job_end(job_id, log, 0, interval_s=0.5, window_s=20)],
        "wait_nodes_change": [rc.wait_nodes_change(None, "", interval_s=0.5, window_s=20)],
        "make_dirs": [rc.make_dirs(f"{job_dir}/made")],
        "read_file": [rc.read_file(log)],
        "read_log_chunk": [rc.read_log_chunk(log, 0)],
        "tail_lines": [rc.tail_lines(log)],
        "list_files": [rc.list_files(job_dir)],
        "write_file": [rc.write_file(f"{job_dir}/written", "x\n")],
        "cancellable": [rc.cancellable(rc.make_dirs(f"{job_dir}/c"), f"{job_dir}/c.pid")],
        "kill_process_group": [rc.kill_process_group(f"{job_dir}/none.pid")],
        "download_to_file": [rc.download_to_file("http://127.0.0.1:9/none", f"{job_dir}/download")],
        "sha256_of": [rc.sha256_of(f"{job_dir}/written")],
        "unpack_tar": [rc.unpack_tar(f"{job_dir}/none.tar", f"{job_dir}/untar")],
        "count_files": [rc.count_files(job_dir, "*")],
        "verify_checksum_manifest": [rc.verify_checksum_manifest(job_dir)],
        "remove_files": [rc.remove_files(f"{job_dir}/written")],
        "upload_files": [rc.upload_files([(f"{job_dir}/none", "http://127.0.0.1:9/none")])],
        "pack_tar": [rc.pack_tar(f"{job_dir}/made", f"{job_dir}/made.tar")],
        "modified_times": [rc.modified_times(f"{job_dir}/written", f"{job_dir}/none")],
        "take_lock": [rc.take_lock(f"{job_dir}/.lock", "run-1", 3600)],
        "release_lock": [rc.release_lock(f"{job_dir}/.lock", "run-1")],
    }
