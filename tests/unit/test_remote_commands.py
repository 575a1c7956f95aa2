"""Command building: every value quoted, secrets only on stdin. Commands are RUN in a local bash
(never just string-compared) so a quoting bug shows up as a created file or a wrong argv."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ultracluster import remote_commands as rc
from ultracluster.parsers.progress import error_reasons, parse_launch
from ultracluster.run.names import JOB_NAME_MAX, slurm_job_name

# Stand-in Slurm programs live in tmp_path/bin (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("slurm_stand_ins")

HOSTILE = [
    "a'b; touch PWNED",
    'a"b$(touch PWNED)',
    "`touch PWNED`",
    "x\\'; touch PWNED; echo '",
    "$HOME && touch PWNED",
    "sp ace|touch PWNED",
]


def run_local(command: rc.RemoteCommand, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command.shell], cwd=cwd, input=command.stdin, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("value", HOSTILE)
def test_file_commands_never_execute_hostile_paths(tmp_path, value):
    target = tmp_path / value.replace("/", "_")
    target.write_text("content\n")
    for command in (
        rc.read_file(str(target)),
        rc.tail_lines(str(target), 5),
        rc.read_log_chunk(str(target), 0),
        rc.sha256_of(str(target)),
        rc.list_files(str(tmp_path)),
        rc.count_files(str(tmp_path), value),
    ):
        result = run_local(command, tmp_path)
        assert result.returncode == 0, (command.shell, result.stderr)
    assert run_local(rc.read_file(str(target)), tmp_path).stdout == "content\n"
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", HOSTILE)
def test_write_make_remove_with_hostile_names(tmp_path, value):
    directory = tmp_path / ("d " + value.replace("/", "_"))
    assert run_local(rc.make_dirs(str(directory)), tmp_path).returncode == 0
    path = directory / "f"
    assert run_local(rc.write_file(str(path), value + "\n"), tmp_path).returncode == 0
    assert path.read_text() == value + "\n"
    assert run_local(rc.remove_files(str(path)), tmp_path).returncode == 0
    assert not path.exists()
    assert not (tmp_path / "PWNED").exists()


def test_values_round_trip_through_the_shell():
    value = "a'b; rm -rf /"
    command = rc.squeue_by_name(value)
    assert value in shlex.split(command.shell)


@pytest.mark.parametrize("bad", ["12; rm -rf /", "abc", "", "1 2", "$(id)"])
def test_job_ids_are_validated(bad):
    with pytest.raises(ValueError):
        rc.scancel(bad)
    with pytest.raises(ValueError):
        rc.scontrol_show_job(bad)


def test_array_job_id_allowed():
    assert shlex.split(rc.scancel("123_4").shell) == [rc.slurm_command("scancel"), "123_4"]


def _fake_bin(tmp_path, name: str) -> None:
    """A program that records its argv (NUL separated) and environment, standing in for sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\0" "$@" > {shlex.quote(str(tmp_path / (name + ".argv")))}\n'
        f"env > {shlex.quote(str(tmp_path / (name + '.env')))}\n"
        "echo 4242\n"
    )
    script.chmod(0o755)


def test_sbatch_passes_hostile_env_and_paths_verbatim(tmp_path):
    _fake_bin(tmp_path, "sbatch")
    job_dir = str(tmp_path / "job dir'x")
    env = {"SCALING_MODE": "strong", "WEIRD": "a,b'c; touch PWNED", "DATA_DIR": "/fsx/data $(touch PWNED)"}
    command = rc.sbatch(
        job_dir=job_dir, script_path=job_dir + "/run.sh", num_nodes=2, job_name="uc.n",
        comment="ultracluster run_id=manual__2026'x", job_env=env, launcher="neuron_parallel_compile",
        launcher_fallback_env={"COMPILE_ONLY": "1"}, partition="compute1",
    )
    result = subprocess.run(
        ["bash", "-c", command.shell], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "sbatch.argv").read_bytes().split(b"\0")[:-1]
    argv = [a.decode() for a in argv]
    assert argv[argv.index("--nodes") + 1] == "2"
    assert "--exclusive" in argv and "--no-requeue" in argv
    assert argv[argv.index("--export") + 1] == "ALL"
    assert argv[argv.index("--comment") + 1] == "ultracluster run_id=manual__2026'x"
    assert argv[argv.index("--output") + 1] == job_dir + "/slurm-%j.out"
    environment = (tmp_path / "sbatch.env").read_text().splitlines()
    assert "WEIRD=a,b'c; touch PWNED" in environment
    assert "DATA_DIR=/fsx/data $(touch PWNED)" in environment
    assert not (tmp_path / "PWNED").exists()
    # The --wrap script itself runs on the node: run it with a fake srun and no launcher.
    wrap = argv[argv.index("--wrap") + 1]
    os.makedirs(job_dir)
    _fake_bin(tmp_path, "srun")
    node = subprocess.run(
        ["/bin/bash", "-c", wrap], cwd=tmp_path, capture_output=True, text=True,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "77"},
    )
    assert node.returncode == 0, node.stderr
    assert "neuron_parallel_compile not found" in node.stdout
    srun_argv = [a.decode() for a in (tmp_path / "srun.argv").read_bytes().split(b"\0")[:-1]]
    assert srun_argv == [job_dir + "/run.sh"]
    assert "COMPILE_ONLY=1" in (tmp_path / "srun.env").read_text().splitlines()
    assert Path(job_dir, "slurm-77.exit").read_text().strip() == "0"


def test_sbatch_wrap_uses_launcher_when_present_and_records_failure(tmp_path):
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    _fake_bin(tmp_path, "neuron_parallel_compile")
    bin_dir = tmp_path / "bin"
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_LOG"\nexit 3\n')
    (bin_dir / "srun").chmod(0o755)
    command = rc.sbatch(
        job_dir=job_dir, script_path=job_dir + "/run.sh", num_nodes=1, job_name="j", comment="c",
        job_env={}, launcher="neuron_parallel_compile",
    )
    words = shlex.split(command.shell)
    wrap = words[words.index("--wrap") + 1]
    node = subprocess.run(
        ["/bin/bash", "-c", wrap], capture_output=True, text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "78", "SRUN_LOG": str(tmp_path / "srun.log")},
    )
    assert node.returncode == 3
    launcher = str(bin_dir / "neuron_parallel_compile")  # from PATH, resolved to its path
    assert (tmp_path / "srun.log").read_text().split() == [launcher, job_dir + "/run.sh"]
    assert Path(job_dir, "slurm-78.exit").read_text().strip() == "3"
    assert Path(job_dir, "slurm-78.launch").read_text().split() == [
        "UC_INFO", "launch", "mode=neuron_parallel_compile", f"path={launcher}"]


def _run_wrap(tmp_path, **sbatch_args) -> tuple[subprocess.CompletedProcess, str]:
    """The --wrap of an sbatch for the compile step, run as the batch node would, with a fake srun
    and a PATH without any Neuron directory (sbatch's PATH)."""
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir, exist_ok=True)
    _fake_bin(tmp_path, "srun")
    command = rc.sbatch(job_dir=job_dir, script_path=job_dir + "/run.sh", num_nodes=1, job_name="j", comment="c",
                        job_env={}, launcher="neuron_parallel_compile", **sbatch_args)
    words = shlex.split(command.shell)
    node = subprocess.run(["/bin/bash", "-c", words[words.index("--wrap") + 1]], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "79"})
    return node, job_dir


def _neuron_dir(tmp_path, name: str) -> str:
    directory = tmp_path / name
    directory.mkdir()
    program = directory / "neuron_parallel_compile"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return str(directory)


def test_the_launcher_is_found_in_the_training_venv_before_the_neuron_bin(tmp_path):
    venv_bin, neuron_bin = _neuron_dir(tmp_path, "venv-bin"), _neuron_dir(tmp_path, "neuron-bin")
    node, job_dir = _run_wrap(tmp_path, launcher_dirs=[venv_bin, neuron_bin])
    assert node.returncode == 0, node.stderr
    srun_argv = [a.decode() for a in (tmp_path / "srun.argv").read_bytes().split(b"\0")[:-1]]
    assert srun_argv == [venv_bin + "/neuron_parallel_compile", job_dir + "/run.sh"]
    assert f"mode=neuron_parallel_compile path={venv_bin}/neuron_parallel_compile" in node.stdout
    # Not in the venv: the Neuron bin directory.
    os.unlink(venv_bin + "/neuron_parallel_compile")
    node, _ = _run_wrap(tmp_path, launcher_dirs=[venv_bin, neuron_bin])
    assert f"path={neuron_bin}/neuron_parallel_compile" in node.stdout


def test_a_missing_launcher_fails_the_job_with_uc_error_and_runs_nothing(tmp_path):
    node, job_dir = _run_wrap(tmp_path, launcher_dirs=[str(tmp_path / "nowhere")])
    assert node.returncode == 2
    reasons = error_reasons(node.stdout)
    assert reasons and reasons[0].startswith(f"neuron_parallel_compile not found in {tmp_path}/nowhere, PATH")
    assert not (tmp_path / "srun.argv").exists()
    assert Path(job_dir, "slurm-79.exit").read_text().strip() == "2"


def test_compile_only_without_the_launcher_only_when_the_caller_opts_in(tmp_path):
    node, job_dir = _run_wrap(tmp_path, launcher_dirs=[], launcher_fallback_env={"COMPILE_ONLY": "1"})
    assert node.returncode == 0, node.stderr
    assert not error_reasons(node.stdout)
    assert "COMPILE_ONLY=1" in (tmp_path / "srun.env").read_text().splitlines()
    assert parse_launch(Path(job_dir, "slurm-79.launch").read_text()) == {"mode": "compile_only", "path": None}


@pytest.mark.parametrize("name", ["1BAD", "A-B", "A B", "A;B", ""])
def test_sbatch_rejects_bad_env_names(name):
    with pytest.raises(ValueError, match="environment variable"):
        rc.sbatch(job_dir="/fsx/j", script_path="/fsx/j/r.sh", num_nodes=1, job_name="j", comment="c",
                  job_env={name: "1"})


def test_sbatch_rejects_zero_nodes_and_newlines():
    with pytest.raises(ValueError):
        rc.sbatch(job_dir="/j", script_path="/j/r.sh", num_nodes=0, job_name="j", comment="c", job_env={})
    with pytest.raises(ValueError):
        rc.sbatch(job_dir="/j", script_path="/j/r.sh", num_nodes=1, job_name="j", comment="c", job_env={"A": "x\ny"})


def test_secrets_only_on_stdin():
    url = "https://bucket.s3.amazonaws.com/k?X-Amz-Signature=SECRET123&X-Amz-Credential=AKIA"
    download = rc.download_to_file(url, "/fsx/data/x.tar")
    upload = rc.upload_files([("/fsx/out/results.json", url)])
    for command in (download, upload):
        assert "SECRET123" not in command.shell
        assert "SECRET123" not in str(command)
        assert "SECRET123" not in repr(command)
        assert "SECRET123" in command.stdin


def test_curl_config_quotes_values(tmp_path):
    """curl itself parses the config: a hostile path and URL survive verbatim."""
    path = str(tmp_path / 'we"ird \\ name')
    command = rc.download_to_file('file://' + str(tmp_path / "src.bin"), path)
    (tmp_path / "src.bin").write_bytes(b"payload")
    result = run_local(command, tmp_path)
    assert result.returncode == 0, result.stderr
    assert Path(path).read_bytes() == b"payload"
    assert not os.path.exists(path + ".part")


def test_read_log_chunk_is_byte_exact(tmp_path):
    import base64

    log = tmp_path / "slurm-1.out"
    content = "UC_PROGRESS step=1 loss=1.0\nünïcödé line\nUC_PROGRESS step=2 loss=0.5\n".encode()
    log.write_bytes(content)
    out = run_local(rc.read_log_chunk(str(log), 10, max_bytes=20), tmp_path).stdout.split("\n")
    assert int(out[0]) == len(content)
    assert base64.b64decode(out[1]) == content[10:30]
    missing = run_local(rc.read_log_chunk(str(tmp_path / "nope"), 0), tmp_path).stdout
    assert missing.strip() == "-1"


def test_job_name_is_deterministic_safe_and_distinct():
    a = slurm_job_name("trn1_bert_pretrain", "manual__2026-11-30T08:00:00+00:00", "train")
    assert a == slurm_job_name("trn1_bert_pretrain", "manual__2026-11-30T08:00:00+00:00", "train")
    assert a != slurm_job_name("trn1_bert_pretrain", "manual__2026-11-30T08:00:01+00:00", "train")
    assert a != slurm_job_name("trn1_bert_pretrain", "manual__2026-11-30T08:00:00+00:00", "parallel_compile")
    hostile = slurm_job_name("d'; rm -rf /", "r$(id)", "t`x`")
    assert shlex.quote(hostile) == hostile
    assert len(slurm_job_name("d" * 500, "r", "t")) <= JOB_NAME_MAX


def test_checksum_manifest_verification(tmp_path):
    (tmp_path / "a_training_1.hdf5").write_bytes(b"one")
    no_manifest = run_local(rc.verify_checksum_manifest(str(tmp_path)), tmp_path)
    assert no_manifest.returncode == 0 and "NO_MANIFEST" in no_manifest.stdout
    subprocess.run("sha256sum a_training_1.hdf5 > SHA256SUMS", shell=True, cwd=tmp_path, check=True)
    assert run_local(rc.verify_checksum_manifest(str(tmp_path)), tmp_path).returncode == 0
    (tmp_path / "a_training_1.hdf5").write_bytes(b"corrupted")
    assert run_local(rc.verify_checksum_manifest(str(tmp_path)), tmp_path).returncode != 0


def live_processes_in_group(group: int) -> list[int]:
    live = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)": state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] != "Z":
            live.append(int(entry))
    return live


def test_cancellable_transfer_is_stopped_through_its_pid_file(tmp_path):
    """A curl blocked on its source (a FIFO nobody writes) keeps running until kill_process_group."""
    import time

    source = tmp_path / "never-written"
    os.mkfifo(source)
    pid_file = str(tmp_path / "dl.pid")
    command = rc.cancellable(rc.download_to_file(f"file://{source}", str(tmp_path / "out.bin")), pid_file)
    assert command.stdin and "never-written" in command.stdin  # the (secret) config still goes on stdin
    process = subprocess.Popen(["bash", "-c", command.shell], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdin.write(command.stdin)
    process.stdin.close()
    for _ in range(100):
        if os.path.exists(pid_file) and open(pid_file).read().strip():
            break
        time.sleep(0.05)
    group = int(Path(pid_file).read_text())
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=1)  # still blocked: closing our side would not stop it either
    assert run_local(rc.kill_process_group(pid_file), tmp_path).returncode == 0
    assert process.wait(timeout=10) != 0
    assert not os.path.exists(pid_file) and not (tmp_path / "out.bin").exists()
    # No live process may remain in the group (zombies count as gone: PID 1 here may never reap them).
    for _ in range(200):
        if not live_processes_in_group(group):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"process group {group} still runs: {live_processes_in_group(group)}")
    # a second kill, or a kill with no transfer running, is a no-op
    assert run_local(rc.kill_process_group(pid_file), tmp_path).returncode == 0


def test_kill_process_group_ignores_a_tampered_pid_file(tmp_path):
    pid_file = tmp_path / "x.pid"
    pid_file.write_text("1; touch PWNED")
    assert run_local(rc.kill_process_group(str(pid_file)), tmp_path).returncode == 0
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("pid", ["0", "1", "01", "00"])
def test_kill_process_group_refuses_pids_0_and_1(tmp_path, pid):
    """kill -- -0 would signal the command's own group, kill -- -1 every process it may signal."""
    pid_file = tmp_path / "x.pid"
    pid_file.write_text(pid)
    sentinel = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        done = run_local(rc.kill_process_group(str(pid_file)), tmp_path)
        assert done.returncode == 1 and "refusing to signal process group" in done.stderr
        assert sentinel.poll() is None  # nothing was signalled
        assert pid_file.exists()  # kept for a human to look at
    finally:
        sentinel.kill()
        sentinel.wait()
