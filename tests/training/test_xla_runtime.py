"""The training program's XLA path on the production pins (torch 2.9.0, torch-xla 2.9.0, transformers
4.57.6: .venvs/training-xla), on torch-xla's CPU runtime (PJRT_DEVICE=CPU), through the real run
script and torchrun.

What the CPU runtime cannot do: collectives across processes. Under torchrun each process's XLA
process group is rank 0 of 1, so the all-reduce of ones gives 1; the start-up collective check turns
that into UC_ERROR (test_two_xla_ranks_...). More than one rank trains on CPU/gloo (test_collectives).
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.training.support import (REPO, TINY_ENV, base_env, progress_lines, results_path, run_emulated,
                                    validate_results)
from ultracluster.run.contracts import extract_metrics

pytestmark = pytest.mark.training

XLA_PYTHON = REPO / ".venvs" / "training-xla" / "bin" / "python"
TINY_PARAMETERS = 4_433_468  # BertForPreTraining, tiny config, decoder tied to the embeddings


@pytest.fixture(scope="module")
def xla_python() -> Path:
    if not XLA_PYTHON.exists():
        pytest.fail(f"{XLA_PYTHON} missing: `make setup-xla` builds it (scripts/setup_xla_venv.sh)")
    return XLA_PYTHON


def xla_env(data_dir: Path, output_root: Path, xla_python: Path, **knobs: str) -> dict[str, str]:
    return {**base_env(), **TINY_ENV, "TRAINING_PYTHON": str(xla_python), "PJRT_DEVICE": "CPU",
            "DATA_DIR": str(data_dir), "OUTPUT_ROOT": str(output_root),
            "COMPILE_CACHE_DIR": str(output_root / "compile_cache"), "NPROC_PER_NODE": "1",
            "GRAD_ACCUM_USTEPS": "2", "SCALING_MODE": "weak", **knobs}


@pytest.fixture(scope="module")
def xla_run(xla_python, data_dir, tmp_path_factory):
    """One job on the XLA path: steps 1-4 (checkpoint at 4), then the same job again: 5-6."""
    work = tmp_path_factory.mktemp("xla")
    env = xla_env(data_dir, work / "out", xla_python, MAX_STEPS="6", STEPS_THIS_RUN="4", STEPS_PER_CKPT="4",
                  LOG_EVERY="2", UC_DEBUG_HOST_TRANSFERS="1")
    runs = []
    for attempt in range(2):
        (work / f"attempt{attempt}").mkdir()
        codes, output = run_emulated(1, "71", env, work / f"attempt{attempt}", timeout=420)
        assert codes == [0], output[-4000:]
        runs.append(output)
    return {"runs": runs, "output_dir": work / "out" / "output_71"}


def test_xla_path_trains_with_tied_bf16_weights_resumes_and_reports(xla_run):
    first, second = xla_run["runs"]
    assert [p.step for p in progress_lines(first)] == [2, 4]
    assert [p.step for p in progress_lines(second)] == [6]
    assert "resuming from" in second and "ckpt_4.pt at step 4" in second
    # The decoder is the embeddings again after the move to the XLA device (8,370,806 without it).
    assert f"params={TINY_PARAMETERS} (built: {TINY_PARAMETERS}) tied=True dtype=bf16" in first
    assert all(8 < p.loss < 12 for p in progress_lines(first + second))

    results = json.loads(results_path(second).read_text())
    validate_results(results)
    parameters = results["results"]["parameters"]
    assert parameters["Device"] == "xla" and parameters["Data type"] == "bf16"
    assert parameters["Optimizer state data type"] == "fp32" and parameters["Autocast"] is None
    assert parameters["Parameter count"] == TINY_PARAMETERS
    assert parameters["Collective check"] == {"backend": "xla", "world_size": 1, "result": 1}
    assert (parameters["Start step"], parameters["End step"]) == (4, 6)
    assert "XLA_DOWNCAST_BF16" not in parameters["Environment variables"]
    # torch-xla's CPU runtime, not Trainium: what the scaling report names (issue 25).
    assert {k: extract_metrics(results)[k] for k in ("model", "device")} == {"model": "BERT-tiny", "device": "xla:CPU"}


def test_no_device_to_host_transfer_on_steps_that_do_not_log(xla_run):
    """torch_xla's TransferFromDeviceTime count per step (UC_DEBUG_HOST_TRANSFERS): logging every 2nd
    step, the odd steps read nothing back from the device; the logged ones read their loss."""
    found = {int(s): int(n) for run in xla_run["runs"]
             for s, n in re.findall(r"UC_DEBUG step=(\d+) device_to_host=(\d+)", run)}
    assert sorted(found) == [1, 2, 3, 4, 5, 6]
    assert {s: found[s] for s in (1, 3, 5)} == {1: 0, 3: 0, 5: 0}
    assert all(found[s] >= 1 for s in (2, 4, 6))


SAMPLE_RESUME = r'''
import json, os, sys, torch, torch_xla
from transformers import BertConfig, BertForPreTraining
from transformers.optimization import get_linear_schedule_with_warmup
ckpt_path, world_size, rank = sys.argv[1], 2, 1
config = BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=512)
model = BertForPreTraining(config)
model.to(torch_xla.device())
model.tie_weights()
model.cls.predictions.decoder.bias = model.cls.predictions.bias
# As dp_bert_large_hf_pretrain_hdf5.py resumes (torch.load's default: weights_only=True on 2.9).
check_point = torch.load(ckpt_path, map_location='cpu')
state = check_point['model']
for k in [k for k in state if k.startswith('module.')]:
    state[k.replace('module.', '')] = state.pop(k)
model.load_state_dict(state, strict=True)
named = list(model.named_parameters())
no_decay = ['bias', 'LayerNorm']
optimizer = torch.optim.AdamW([
    {'params': [p for n, p in named if not any(nd in n for nd in no_decay)], 'weight_decay': 0.01},
    {'params': [p for n, p in named if any(nd in n for nd in no_decay)], 'weight_decay': 0.0}], 4e-4)
optimizer.load_state_dict(check_point['optimizer'])
scheduler_state_dict = check_point.pop('scheduler')
files = check_point['files'][1:]
file_start_idx = check_point['files'][0]
epoch = check_point.get('epoch', 0)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=6,
                                            last_epoch=epoch if scheduler_state_dict else -1)
scheduler.load_state_dict(scheduler_state_dict)
data_file = files[(file_start_idx * world_size + rank) % len(files)]
print(json.dumps({
    "weights": sorted({str(v.dtype) for v in check_point['model'].values()}),
    "moments": sorted({str(s['exp_avg'].dtype) for s in check_point['optimizer']['state'].values()}),
    "file_start_idx": file_start_idx, "files": files, "data_file_exists": os.path.isfile(data_file),
    "epoch": epoch, "scheduler_last_epoch": scheduler.last_epoch, "step": check_point['step']}))
'''


def test_a_checkpoint_loads_the_way_the_sample_resumes(xla_run, xla_python, data_dir):
    """ckpt_<step>.pt carries the keys the Neuron sample's resume reads (model, optimizer, scheduler,
    files, epoch) and loads with torch 2.9's weights-only default, into the sample's tied model."""
    checkpoint = xla_run["output_dir"] / "checkpoints" / "ckpt_6.pt"
    done = subprocess.run([str(xla_python), "-c", SAMPLE_RESUME, str(checkpoint)], capture_output=True,
                          text=True, timeout=300, env={**base_env(), "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["weights"] == ["torch.bfloat16"] and facts["moments"] == ["torch.float32"]
    assert sorted(facts["files"]) == sorted(str(p) for p in data_dir.glob("*_training_*.hdf5"))
    assert facts["file_start_idx"] >= 0 and facts["data_file_exists"]
    assert facts["epoch"] == 0 and facts["step"] == 6 and facts["scheduler_last_epoch"] == 6


def test_two_xla_ranks_on_the_cpu_runtime_fail_the_collective_check(xla_python, data_dir, tmp_path):
    env = xla_env(data_dir, tmp_path / "out", xla_python, NPROC_PER_NODE="2", MAX_STEPS="2")
    codes, output = run_emulated(1, "72", env, tmp_path, timeout=420)

    assert codes != [0], output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("UC_ERROR ")]
    assert errors and all("collective check failed on rank" in e and "gave 1, expected the world size 2"
                          in e and "backend xla, world size 2" in e for e in errors), output[-3000:]
    assert progress_lines(output) == []
    assert not list((tmp_path / "out").rglob("ckpt_*.pt"))


def test_the_fault_switch_fails_the_collective_check_on_xla(xla_python, data_dir, tmp_path):
    env = xla_env(data_dir, tmp_path / "out", xla_python, MAX_STEPS="2", UC_FAULT_COLLECTIVE_CHECK="0")
    codes, output = run_emulated(1, "73", env, tmp_path, timeout=420)

    assert codes != [0]
    assert ("UC_ERROR collective check failed on rank 0: the all-reduce of ones over ranks 0-0 gave 0, "
            "expected the world size 1 (backend xla, world size 1") in output, output[-3000:]
    assert progress_lines(output) == []
