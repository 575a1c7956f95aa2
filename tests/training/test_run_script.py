"""The run script and training program on this machine, without a Slurm cluster.

Each 'node' is the real run script started with the variables srun sets for it (SLURM_NTASKS,
SLURM_NODEID, SLURM_JOB_ID, SLURM_JOB_NODELIST); they rendezvous on 127.0.0.1 and train the tiny
BERT with torchrun + gloo. tests/training/test_slurm_cluster.py runs the same through sbatch.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path

import pytest

from tests.training.support import (TINY_ENV, base_env, metric_values, processes_mentioning, progress_lines,
                                    results_path, run_emulated, run_script_once, slurm_env, validate_results,
                                    EmulatedNodes)
from ultracluster.run.contracts import extract_metrics

pytestmark = pytest.mark.training


def tiny_env(data_dir: Path, output_root: Path, **knobs: str) -> dict[str, str]:
    return base_env(**{**TINY_ENV, "DATA_DIR": str(data_dir), "OUTPUT_ROOT": str(output_root),
                       "COMPILE_CACHE_DIR": str(output_root / "compile_cache"), **knobs})


# ---------------------------------------------------------------- errors before launch
@pytest.mark.parametrize("case", ["empty_data_dir", "missing_data_dir", "non_dividing_nodes",
                                  "zero_accumulation", "world_size_over_files", "unknown_model_size",
                                  "unknown_scaling_mode", "bad_number", "two_tasks_per_node"])
def test_bad_input_is_refused_before_launch(case, training_python, data_dir, few_shards, tmp_path):
    nodes, knobs = 2, {}
    if case == "empty_data_dir":
        (tmp_path / "empty").mkdir()
        knobs, expected = {"DATA_DIR": str(tmp_path / "empty")}, "holds no *_training_*.hdf5 files"
    elif case == "missing_data_dir":
        knobs, expected = {"DATA_DIR": str(tmp_path / "nowhere")}, "does not exist"
    elif case == "non_dividing_nodes":
        nodes, knobs = 3, {"SCALING_MODE": "strong", "GRAD_ACCUM_USTEPS": "32"}
        expected = "GRAD_ACCUM_USTEPS=32 is not divisible by 3 nodes"
    elif case == "zero_accumulation":
        nodes, knobs = 3, {"SCALING_MODE": "strong", "GRAD_ACCUM_USTEPS": "2"}
        expected = "3 nodes would leave 0 of GRAD_ACCUM_USTEPS=2"
    elif case == "world_size_over_files":
        knobs, expected = {"DATA_DIR": str(few_shards(1))}, "world size 2 (2 nodes x 1 workers) exceeds the 1"
    elif case == "unknown_model_size":
        knobs, expected = {"MODEL_SIZE": "huge"}, "unknown MODEL_SIZE 'huge' (known: large tiny)"
    elif case == "unknown_scaling_mode":
        knobs, expected = {"SCALING_MODE": "linear"}, "SCALING_MODE must be 'strong' or 'weak'"
    elif case == "bad_number":
        knobs, expected = {"BATCH_SIZE": "8x"}, "BATCH_SIZE must be a positive integer, got '8x'"
    else:
        knobs, expected = {"SLURM_NNODES": "1"}, "expected one task per node, got SLURM_NTASKS=2"

    env = {**tiny_env(data_dir, tmp_path / "out", GRAD_ACCUM_USTEPS="2"), **slurm_env(nodes, 0, "501"),
           **knobs, "MASTER_ADDR": "127.0.0.1"}
    done = run_script_once(env)

    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stdout.splitlines() if line.startswith("UC_ERROR ")]
    assert len(errors) == 1 and expected in errors[0], done.stdout
    assert not (tmp_path / "out").exists()  # refused before creating outputs or launching
    assert processes_mentioning(str(tmp_path)) == []


def test_weak_scaling_accepts_a_node_count_strong_scaling_refuses(training_python, data_dir, tmp_path):
    # Only the pre-launch checks: an unresolvable master stops the script right after them.
    env = {**tiny_env(data_dir, tmp_path / "out", GRAD_ACCUM_USTEPS="32", SCALING_MODE="weak"),
           **slurm_env(3, 0, "502"), "MASTER_ADDR": "no-such-host.invalid"}
    done = run_script_once(env)
    assert done.returncode == 2
    assert "UC_ERROR master host 'no-such-host.invalid' does not resolve" in done.stdout


def test_local_clusters_running_at_once_get_distinct_rendezvous_ports(data_dir, tmp_path):
    """Every local cluster names its first node alike and counts jobs from 1; the rendezvous listens
    on all addresses. The master's IP (127.100.<slot>.x) gives each cluster a port block of its own."""
    ports = {}
    for slot in (7, 8, 200):
        # /bin/true stands in for the training Python: only the launch line matters here.
        env = {**tiny_env(data_dir, tmp_path / f"out{slot}"), **slurm_env(1, 0, "1"),
               "MASTER_ADDR": f"127.100.{slot}.11", "TRAINING_PYTHON": "/bin/true"}
        done = run_script_once(env)
        [info] = [line for line in done.stdout.splitlines() if line.startswith("UC_INFO node=")]
        ports[slot] = int(re.search(r"master=127\.100\.\d+\.11:(\d+)", info).group(1))
    assert len(set(ports.values())) == 3 and all(61000 <= p <= 65535 for p in ports.values())
    assert {p - 17 * slot for slot, p in ports.items()} == {ports[7] - 17 * 7}  # one offset, the job's


@pytest.mark.parametrize("compiler_on_path", [False, True])
def test_a_neuron_compile_job_checks_the_compiler_first(data_dir, tmp_path, compiler_on_path):
    """Under neuron_parallel_compile (NEURON_EXTRACT_GRAPHS_ONLY) the compiler must be on the job's PATH:
    without it the job stops before it launches anything, naming neuronx-cc."""
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    if compiler_on_path:
        (bin_dir / "neuronx-cc").write_text("#!/bin/sh\n")
        (bin_dir / "neuronx-cc").chmod(0o755)
    env = {**tiny_env(data_dir, tmp_path / "out"), **slurm_env(1, 0, "11"), "MASTER_ADDR": "127.0.0.1",
           "TRAINING_PYTHON": str(fake_training_python(tmp_path, 0)), "NEURON_EXTRACT_GRAPHS_ONLY": "1",
           "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = run_script_once(env)

    if compiler_on_path:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "compile_only=1" in done.stdout
    else:
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"UC_ERROR neuronx-cc not found on the job's PATH ({bin_dir}:/usr/bin:/bin)" in done.stdout
        assert not (tmp_path / "tmpdir-seen").exists() and not (tmp_path / "out").exists()


def fake_training_python(tmp_path: Path, exit_code: int) -> Path:
    """Stands in for the training Python: records the temporary directory it was given, then exits."""
    fake = tmp_path / f"fake-python-{exit_code}"
    fake.write_text(f'#!/bin/sh\necho "${{TMPDIR:-unset}}" > "{tmp_path}/tmpdir-seen"\n'
                    f'[ -n "${{TMPDIR:-}}" ] && touch "$TMPDIR/compiler-work"\nexit {exit_code}\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("exit_code", [0, 1])
def test_temporary_files_go_to_node_local_scratch(data_dir, tmp_path, exit_code):
    """LOCAL_SCRATCH_DIR (a node's NVMe): the job's TMPDIR is a directory per job and node there; a
    successful job removes it, a failed one keeps it for a look."""
    nvme = tmp_path / "local_storage"
    nvme.mkdir()
    env = {**tiny_env(data_dir, tmp_path / "out"), **slurm_env(1, 0, "7"), "MASTER_ADDR": "127.0.0.1",
           "TRAINING_PYTHON": str(fake_training_python(tmp_path, exit_code)), "LOCAL_SCRATCH_DIR": str(nvme)}
    done = run_script_once(env)

    scratch = nvme / "ultracluster-7-0"
    assert done.returncode == exit_code, done.stdout + done.stderr
    assert (tmp_path / "tmpdir-seen").read_text().strip() == str(scratch / "tmp")
    assert f"scratch={scratch}" in done.stdout
    assert (scratch / "tmp" / "compiler-work").exists() is (exit_code != 0)


def test_without_node_local_scratch_the_job_keeps_the_default_tmpdir(data_dir, tmp_path):
    env = {**tiny_env(data_dir, tmp_path / "out"), **slurm_env(1, 0, "8"), "MASTER_ADDR": "127.0.0.1",
           "TRAINING_PYTHON": str(fake_training_python(tmp_path, 0)), "LOCAL_SCRATCH_DIR": ""}
    env.pop("TMPDIR", None)
    done = run_script_once(env)

    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "tmpdir-seen").read_text().strip() == "unset"
    assert "scratch=none" in done.stdout


def test_a_named_scratch_dir_that_is_missing_fails_the_job(data_dir, tmp_path):
    """No silent fall back to the root volume when the node's NVMe is not mounted."""
    env = {**tiny_env(data_dir, tmp_path / "out"), **slurm_env(1, 0, "9"), "MASTER_ADDR": "127.0.0.1",
           "TRAINING_PYTHON": str(fake_training_python(tmp_path, 0)), "LOCAL_SCRATCH_DIR": str(tmp_path / "missing")}
    done = run_script_once(env)

    assert done.returncode == 2
    assert f"UC_ERROR LOCAL_SCRATCH_DIR '{tmp_path / 'missing'}' is not a writable directory" in done.stdout
    assert not (tmp_path / "tmpdir-seen").exists()


# ---------------------------------------------------------------- training across 2 nodes
def test_two_nodes_loss_falls_and_results_validate(training_python, data_dir, tmp_path):
    env = tiny_env(data_dir, tmp_path, MAX_STEPS="40", GRAD_ACCUM_USTEPS="2", SCALING_MODE="strong")
    started = dt.datetime.now(dt.timezone.utc)
    codes, out = run_emulated(2, "601", env, tmp_path)
    assert codes == [0, 0], out[-3000:]

    progress = progress_lines(out)
    assert [p.step for p in progress] == list(range(1, 41))
    assert {p.total for p in progress} == {40}
    first, last = progress[:5], progress[-5:]
    assert sum(p.loss for p in last) / 5 < sum(p.loss for p in first) / 5 - 1.0  # clearly learning
    assert max(p.lr for p in progress) == pytest.approx(0.001, abs=1e-6)     # warmup reaches the peak
    assert progress[-1].eta_s == 0 and all(p.throughput > 0 for p in progress)

    path = results_path(out)
    output_dir = tmp_path / "output_601"
    assert path == output_dir / "results.json"
    results = json.loads(path.read_text())
    validate_results(results)
    params = results["results"]["parameters"]
    assert params["World size"] == 2 and params["Number of nodes"] == 2
    assert params["Auto resume"] == {"resumes": 0, "steps_lost": 0, "history": [], "nodes_lost": {}}
    assert params["Gradient accumulation microsteps"] == 1 and params["Global batch size"] == 16
    assert not [k for k in params["Environment variables"] if k.startswith(("FI_", "NEURON_"))]  # not Trn1
    # What the scaling report names (issue 25): the model and the device that really trained.
    assert {k: extract_metrics(results)[k] for k in ("model", "device")} == {"model": "BERT-tiny", "device": "cpu"}
    assert metric_values(results, "Sequences processed") == [16 * 40]
    assert metric_values(results, "Final loss") == [pytest.approx(progress[-1].loss, abs=1e-6)]
    assert len(metric_values(results, "Loss")) == 40
    assert metric_values(results, "Compile cache misses") == [0]
    # The first step's wall-clock time (make bench's time to first step ends there): within the job.
    (first_step,) = [m for m in results["results"]["metrics"] if m["MetricName"] == "First step"]
    done_at = dt.datetime.fromisoformat(first_step["AdditionalData"]["at"])
    assert first_step["AdditionalData"]["step"] == 1 and first_step["MeasuredValue"] > 0
    assert started <= done_at <= dt.datetime.now(dt.timezone.utc), (started, first_step)

    logs = sorted(p.name for p in output_dir.glob("log_ph1_bf16_*"))
    assert logs == ["log_ph1_bf16_0_2", "log_ph1_bf16_1_2"]
    assert "UC_PROGRESS" not in (output_dir / "log_ph1_bf16_1_2").read_text()  # rank 0 reports
    assert sorted(p.name for p in (output_dir / "checkpoints").iterdir()) == ["ckpt_30.pt", "ckpt_40.pt"]


def test_strong_and_weak_scaling_give_the_formula_global_batch(training_python, data_dir, tmp_path):
    found = {}
    for mode, job in (("strong", "611"), ("weak", "612")):
        env = tiny_env(data_dir, tmp_path, MAX_STEPS="3", GRAD_ACCUM_USTEPS="4", SCALING_MODE=mode)
        codes, out = run_emulated(2, job, env, tmp_path)
        assert codes == [0, 0], out[-3000:]
        results = json.loads(results_path(out).read_text())
        validate_results(results)
        info = next(line for line in out.splitlines() if line.startswith("UC_INFO node=0/2"))
        found[mode] = (results["results"]["parameters"], metric_values(results, "Sequences processed")[0], info)

    # strong: BATCH * (GRAD_ACCUM / nodes) * nodes = 8 * 2 * 2; weak: BATCH * GRAD_ACCUM * nodes = 8 * 4 * 2
    for mode, accum, global_batch in (("strong", 2, 32), ("weak", 4, 64)):
        params, sequences, info = found[mode]
        assert params["Gradient accumulation microsteps"] == accum
        assert params["Global batch size"] == global_batch
        assert f"grad_accum_usteps={accum} global_batch={global_batch}" in info
        assert sequences == global_batch * 3  # what the ranks really consumed


def test_killed_job_resumes_from_checkpoint_without_repeating_steps(training_python, data_dir, tmp_path):
    env = tiny_env(data_dir, tmp_path, MAX_STEPS="40", GRAD_ACCUM_USTEPS="2", STEPS_PER_CKPT="10")
    first = EmulatedNodes(2, "621", env, tmp_path)
    checkpoints = tmp_path / "output_621" / "checkpoints"
    deadline = time.monotonic() + 180
    while not any(p.step >= 22 for p in progress_lines(first.output(0))):
        assert time.monotonic() < deadline and all(p.poll() is None for p in first.processes), first.output(0)
        time.sleep(0.2)
    first.kill()  # the launchers die, as when a job is killed or its node lost
    # The workers notice their torchrun is gone and stop: nothing races the resubmitted job.
    deadline = time.monotonic() + 60
    while processes_mentioning(str(tmp_path / "output_621")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(tmp_path / "output_621")) == []
    killed_at = max(p.step for p in progress_lines(first.output(0)))
    saved = sorted(int(p.stem.split("_")[1]) for p in checkpoints.glob("ckpt_*.pt"))
    assert saved and saved[-1] == 20 and killed_at < 40
    assert not (tmp_path / "output_621" / "results.json").exists()

    # Resubmitted: a new job id, pointed at the killed job's output dir.
    auto_resume = {"resumes": 1, "steps_lost": killed_at - 20, "history": [  # what train's auto-resume passes
        {"failed_job_id": "621", "state": "NODE_FAIL", "last_step": killed_at, "from_step": 20,
         "steps_lost": killed_at - 20, "job_id": None}]}
    codes, out = run_emulated(2, "622", {**env, "RESUME_DIR": str(tmp_path / "output_621"),
                                         "AUTO_RESUME": json.dumps(auto_resume)}, tmp_path)
    assert codes == [0, 0], out[-3000:]
    assert f"resuming from {checkpoints / 'ckpt_20.pt'} at step 20" in out
    resumed = progress_lines(out)
    assert [p.step for p in resumed] == list(range(21, 41))
    before = {p.step: p for p in progress_lines(first.output(0))}
    # The model continued (loss near where it was), it did not restart from scratch (~11).
    assert resumed[0].loss < before[1].loss - 0.5
    assert resumed[0].lr == pytest.approx(before[21].lr, abs=1e-6)
    results = json.loads(results_path(out).read_text())
    validate_results(results)
    params = results["results"]["parameters"]
    assert params["Start step"] == 20 and params["End step"] == 40
    assert params["Resumed from"] == str(checkpoints / "ckpt_20.pt")
    assert params["Auto resume"] == auto_resume
    assert metric_values(results, "Sequences processed") == [16 * 20]


def test_rerun_of_the_same_job_continues_where_it_stopped(training_python, data_dir, tmp_path):
    # A requeued job keeps its job id, so its output dir: the rerun finds its own checkpoint.
    env = tiny_env(data_dir, tmp_path, MAX_STEPS="12", STEPS_THIS_RUN="6", GRAD_ACCUM_USTEPS="2")
    codes, out = run_emulated(2, "631", env, tmp_path)
    assert codes == [0, 0], out[-3000:]
    assert [p.step for p in progress_lines(out)] == [1, 2, 3, 4, 5, 6]

    codes, out = run_emulated(2, "631", env, tmp_path)
    assert codes == [0, 0], out[-3000:]
    assert [p.step for p in progress_lines(out)] == [7, 8, 9, 10, 11, 12]
    assert {p.total for p in progress_lines(out)} == {12}
    results = json.loads(results_path(out).read_text())
    assert results["results"]["parameters"]["Start step"] == 6


@pytest.mark.parametrize("trigger", [{"COMPILE_ONLY": "1"}, {"NEURON_EXTRACT_GRAPHS_ONLY": "1"}])
def test_compile_only_runs_a_few_steps_and_reports_the_cache(trigger, training_python, data_dir, tmp_path):
    env = {**tiny_env(data_dir, tmp_path, MAX_STEPS="40", GRAD_ACCUM_USTEPS="2", COMPILE_STEPS="2"), **trigger}
    if "NEURON_EXTRACT_GRAPHS_ONLY" in trigger:  # under neuron_parallel_compile, whose venv holds neuronx-cc
        tools = tmp_path / "neuron-venv-bin"
        tools.mkdir()
        (tools / "neuronx-cc").write_text("#!/bin/sh\nexit 0\n")
        (tools / "neuronx-cc").chmod(0o755)
        env["PATH"] = f"{tools}:{env['PATH']}"
    codes, out = run_emulated(2, "641", env, tmp_path)
    assert codes == [0, 0], out[-3000:]
    assert [p.step for p in progress_lines(out)] == [1, 2]
    assert "UC_COMPILE_CACHE backend=none hits=0 misses=0" in out
    results = json.loads(results_path(out).read_text())
    validate_results(results)
    assert results["results"]["parameters"]["Compile only"] is True
    assert not (tmp_path / "output_641" / "checkpoints").exists()  # the real run starts from step 0


def test_a_later_run_resumes_from_resume_ckpt_and_a_requeue_keeps_its_own_progress(training_python, data_dir,
                                                                                   tmp_path):
    """resume_from: restore_checkpoint puts the saved checkpoint on shared storage and train gets it
    as RESUME_CKPT. A later run continues at its step; a requeued job that has saved since continues
    from its own newer checkpoint, not from RESUME_CKPT again."""
    import shutil

    env = tiny_env(data_dir, tmp_path, MAX_STEPS="40", GRAD_ACCUM_USTEPS="2", STEPS_PER_CKPT="10",
                   NUM_CKPTS_TO_KEEP="3")
    codes, out = run_emulated(1, "631", {**env, "STEPS_THIS_RUN": "20"}, tmp_path)
    assert codes == [0], out[-3000:]
    saved = tmp_path / "output_631" / "checkpoints" / "ckpt_20.pt"
    resume = tmp_path / "fsx" / ".resume"
    resume.mkdir(parents=True)
    shutil.copy(saved, resume / "ckpt_20.pt")  # what restore_checkpoint downloads from S3
    shutil.copy(tmp_path / "output_631" / "checkpoints" / "ckpt_10.pt", resume / "ckpt_10.pt")

    later = tmp_path / "later"
    env = {**env, "OUTPUT_ROOT": str(later), "STEPS_THIS_RUN": "10"}
    codes, out = run_emulated(1, "632", {**env, "RESUME_CKPT": str(resume / "ckpt_20.pt")}, tmp_path)
    assert codes == [0], out[-3000:]
    assert f"resuming from {resume / 'ckpt_20.pt'} at step 20" in out
    assert [p.step for p in progress_lines(out)] == list(range(21, 31))
    params = json.loads(results_path(out).read_text())["results"]["parameters"]
    assert (params["Start step"], params["End step"]) == (20, 30)
    assert params["Resumed from"] == str(resume / "ckpt_20.pt")

    # Job 632 again (requeued: same output dir, which holds ckpt_30 now) with an older RESUME_CKPT.
    codes, out = run_emulated(1, "632", {**env, "RESUME_CKPT": str(resume / "ckpt_10.pt")}, tmp_path)
    assert codes == [0], out[-3000:]
    assert f"resuming from {later / 'output_632' / 'checkpoints' / 'ckpt_30.pt'} at step 30" in out
    assert [p.step for p in progress_lines(out)] == list(range(31, 41))


def test_a_missing_resume_ckpt_is_refused_before_launch(training_python, data_dir, tmp_path):
    env = {**tiny_env(data_dir, tmp_path / "out", RESUME_CKPT=str(tmp_path / "nope" / "ckpt_5.pt")),
           **slurm_env(1, 0, "633"), "MASTER_ADDR": "127.0.0.1"}
    done = run_script_once(env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"UC_ERROR RESUME_CKPT '{tmp_path / 'nope' / 'ckpt_5.pt'}' is not a file" in done.stdout
    assert not (tmp_path / "out").exists()
