"""LAMB, the learning-rate schedule and seeding of the training program, checked in the training venv."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.training.support import TRAINING_DIR, progress_lines, results_path

pytestmark = pytest.mark.training

# Runs inside the training venv: one LAMB step against the formula written out with NumPy.
LAMB_CHECK = r"""
import json, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
from dp_bert_large_hf_pretrain_hdf5 import Lamb, lr_factor

rng = np.random.default_rng(0)
w0 = rng.normal(size=(4, 3)).astype(np.float32)
grads = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(3)]
lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-6, 0.01

param = torch.nn.Parameter(torch.tensor(w0))
opt = Lamb([param], lr=lr, weight_decay=wd)
w, m, v = w0.astype(np.float64), 0.0, 0.0
for t, g in enumerate(grads, start=1):
    param.grad = torch.tensor(g)
    opt.step()
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    update = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * w
    w = w - lr * (np.linalg.norm(w) / np.linalg.norm(update)) * update
print(json.dumps({
    "max_abs_diff": float(np.abs(param.detach().numpy() - w).max()),
    "moved": float(np.abs(w - w0).max()),
    "schedule": [lr_factor(s, 4, 12) for s in range(12)],
}))
"""


def test_lamb_step_matches_the_formula_and_schedule_warms_up_then_decays(training_python):
    done = subprocess.run([str(training_python), "-c", LAMB_CHECK, str(TRAINING_DIR)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["moved"] > 1e-3
    assert report["max_abs_diff"] < 1e-5
    schedule = report["schedule"]
    assert schedule[:4] == [0.25, 0.5, 0.75, 1.0]                      # linear warmup
    assert schedule[4:] == pytest.approx([(12 - s) / 8 for s in range(4, 12)])  # linear decay to 0 at max


def test_single_process_lamb_run_learns(training_python, data_dir, tmp_path):
    # The program alone (no torchrun): world size 1, no process group.
    done = subprocess.run(
        [str(training_python), str(TRAINING_DIR / "dp_bert_large_hf_pretrain_hdf5.py"),
         "--data_dir", str(data_dir), "--output_dir", str(tmp_path / "out"), "--model_size", "tiny",
         "--optimizer", "lamb", "--lr", "0.05", "--max_steps", "25", "--warmup_steps", "3",
         "--batch_size", "8", "--grad_accum_usteps", "2", "--num_threads", "2"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    progress = progress_lines(done.stdout)
    assert [p.step for p in progress] == list(range(1, 26))
    assert sum(p.loss for p in progress[-5:]) / 5 < sum(p.loss for p in progress[:5]) / 5 - 1.0
    results = json.loads(results_path(done.stdout).read_text())
    assert results["results"]["parameters"]["Optimizer"] == "LAMB"
    assert results["results"]["parameters"]["World size"] == 1


def test_same_seed_gives_the_same_run_and_another_seed_does_not(training_python, data_dir, tmp_path):
    def losses(seed: str, name: str) -> list[float]:
        done = subprocess.run(
            [str(training_python), str(TRAINING_DIR / "dp_bert_large_hf_pretrain_hdf5.py"),
             "--data_dir", str(data_dir), "--output_dir", str(tmp_path / name), "--model_size", "tiny",
             "--max_steps", "4", "--warmup_steps", "1", "--batch_size", "8", "--grad_accum_usteps", "1",
             "--lr", "0.001", "--num_threads", "1", "--seed", seed],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return [p.loss for p in progress_lines(done.stdout)]

    first, again, other = losses("11", "a"), losses("11", "b"), losses("12", "c")
    assert len(first) == 4
    assert first == again
    assert first != other
