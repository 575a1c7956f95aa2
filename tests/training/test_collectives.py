"""Collectives on the CPU/gloo path (the local cluster's): the loss reduced across ranks, gradients
all-reduced, and the start-up collective check with its fault switch. Each 'node' is the real run
script with the variables srun sets; they rendezvous on 127.0.0.1.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.training.support import TINY_ENV, base_env, progress_lines, run_emulated

pytestmark = pytest.mark.training

# A freshly initialised BERT predicts ~uniformly: MLM loss ~ ln(vocab), NSP loss ~ ln(2).
INITIAL_LOSS = math.log(30522) + math.log(2)


def cpu_env(data_dir: Path, output_root: Path, **knobs: str) -> dict[str, str]:
    return base_env(**{**TINY_ENV, "DATA_DIR": str(data_dir), "OUTPUT_ROOT": str(output_root),
                       "COMPILE_CACHE_DIR": str(output_root / "compile_cache"), "SCALING_MODE": "weak",
                       "GRAD_ACCUM_USTEPS": "1", **knobs})


def test_one_and_two_ranks_agree_on_the_step_1_loss_and_end_in_sync(training_python, data_dir, tmp_path):
    """The step loss is the mean over ranks (a sum of loss / world size), not a rank's share of it:
    one rank and two ranks report about the same initial loss. Two ranks end with identical weights."""
    losses = {}
    for nodes in (1, 2):
        env = cpu_env(data_dir, tmp_path / f"out{nodes}", MAX_STEPS="2")
        codes, output = run_emulated(nodes, f"8{nodes}", env, tmp_path, timeout=240)
        assert codes == [0] * nodes, output[-3000:]
        losses[nodes] = progress_lines(output)[0].loss
        if nodes == 2:
            assert "replicas in sync: 2 ranks" in output
    assert abs(losses[1] - losses[2]) < 0.1, losses
    assert all(abs(loss - INITIAL_LOSS) < 0.3 for loss in losses.values()), losses


def test_the_fault_switch_fails_the_collective_check_on_every_gloo_rank(training_python, data_dir, tmp_path):
    env = cpu_env(data_dir, tmp_path / "out", MAX_STEPS="2", UC_FAULT_COLLECTIVE_CHECK="1")
    codes, _ = run_emulated(2, "83", env, tmp_path, timeout=240)

    assert codes == [1, 1]  # torchrun's exit status: a worker failed
    for node in (0, 1):
        text = (tmp_path / "out" / "output_83" / f"log_ph1_bf16_{node}_2").read_text()
        assert (f"UC_ERROR collective check failed on rank {node}: the all-reduce of ones over ranks 0-1 "
                f"gave 1, expected the world size 2 (backend gloo, world size 2, process group: rank {node} "
                "of 2); UC_FAULT_COLLECTIVE_CHECK is set") in text, text[-2000:]
        assert progress_lines(text) == []
