"""No remote command depends on a login shell's PATH: on a ParallelCluster node Slurm's programs are
in /opt/slurm/bin, which only /etc/profile.d/slurm.sh (login shells) puts on PATH, and a job inherits
sbatch's PATH. tests/integration/test_twin_paths.py runs the same samples on the twin's head node."""
from __future__ import annotations

import os
import re
import shlex
import subprocess

from tests.remote_command_samples import SLURM_PROGRAMS, builders, samples
from ultracluster import remote_commands as rc

_WORD = re.compile(r"[A-Za-z0-9_./-]+")


def test_slurm_lives_where_parallelcluster_installs_it():
    # aws-parallelcluster-cookbook: aws-parallelcluster-slurm/attributes/slurm_attributes.rb install_dir.
    assert rc.SLURM_BIN == "/opt/slurm/bin" and rc.slurm_command("sinfo") == "/opt/slurm/bin/sinfo"


def test_every_builder_has_a_sample():
    assert sorted(builders()) == sorted(samples("/fsx/x"))


def test_every_slurm_program_in_every_command_is_named_in_full():
    bare = []
    for name, commands in samples("/fsx/jobs/x", launcher_dirs=("/opt/venv/bin",)).items():
        for command in commands:
            for word in _WORD.findall(command.shell):
                if os.path.basename(word) in SLURM_PROGRAMS and word != rc.slurm_command(os.path.basename(word)):
                    bare.append((name, word))
    assert bare == []


def test_the_jobs_path_leads_with_the_training_env_the_neuron_tools_and_slurm(tmp_path):
    """The job's PATH is sbatch's (a non-login shell's): the wrap puts the training environment's bin/
    (where neuronx-cc is), /opt/aws/neuron/bin and /opt/slurm/bin in front of it."""
    venv_bin, neuron_bin = str(tmp_path / "venv" / "bin"), str(tmp_path / "neuron" / "bin")
    command = rc.sbatch(job_dir=str(tmp_path), script_path="/bin/true", num_nodes=1, job_name="j", comment="c",
                        job_env={}, launcher_dirs=[venv_bin, neuron_bin, "relative/ignored"])
    words = shlex.split(command.shell)
    wrap = words[words.index("--wrap") + 1]
    # Instead of srun starting the script: print the PATH the script would see.
    assert wrap.count(rc.slurm_command("srun")) == 1
    wrap = wrap.replace(rc.slurm_command("srun"), "printenv PATH;")
    job = subprocess.run(["/bin/sh", "-c", wrap], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5"})
    assert job.returncode == 0, job.stderr
    assert job.stdout.split("\n")[0].split(":") == [venv_bin, neuron_bin, rc.SLURM_BIN, "/usr/bin", "/bin"]
