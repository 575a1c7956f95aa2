"""Checkpoints: ckpt_<step>.pt files written atomically by rank 0, found and restored at start-up.

Besides this program's keys (step, model, optimizer, rng, batch facts) a checkpoint carries the
keys the Neuron sample's resume reads (model, optimizer, scheduler, files, epoch), so it can seed the
sample's phase 2. Everything in it loads with torch.load(weights_only=True), the default of the
torch 2.9 that the sample runs on.
"""
from __future__ import annotations

import os
import pickle
import random
import re
from pathlib import Path

import numpy as np
import torch

from pretrain_runtime import UsageError, log

CHECKPOINT_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")


def checkpoints_in(directory: Path) -> list[tuple[int, Path]]:
    found = []
    if directory.is_dir():
        for entry in directory.iterdir():
            match = CHECKPOINT_PATTERN.match(entry.name)
            if match:
                found.append((int(match.group(1)), entry))
    return sorted(found)


def find_resume_checkpoint(args, checkpoint_dir: Path) -> Path | None:
    """The newest of this job's checkpoints, --resume_dir's and --resume_ckpt: a requeued or
    resubmitted job that started from --resume_ckpt continues from what it saved since."""
    candidates = checkpoints_in(checkpoint_dir)
    if args.resume_dir:
        candidates += checkpoints_in(Path(args.resume_dir) / "checkpoints")
    if args.resume_ckpt:
        path = Path(args.resume_ckpt)
        if not path.is_file():
            raise UsageError(f"--resume_ckpt {path} does not exist")
        match = CHECKPOINT_PATTERN.match(path.name)
        candidates.append((int(match.group(1)) if match else -1, path))  # unnamed: only when alone
    return max(candidates)[1] if candidates else None


def rng_state() -> dict:
    """Python, NumPy and torch RNG states in types weights_only loading accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "numpy": (name, keys.tolist(), pos, has_gauss, cached),
            "torch": torch.get_rng_state()}


def restore_rng(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))  # a list after a weights-only load
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


def save_checkpoint(runtime, checkpoint_dir: Path, step, model, optimizer, scheduler, keep, extra,
                    sample_files, epoch):
    """Rank 0 writes ckpt_<step>.pt atomically and keeps the newest `keep` checkpoints.

    sample_files: the sample's "files", [index of rank 0's current file in its list, then the
    epoch's shard list], which its resume reads as files[(index * world + rank) % len].
    """
    if runtime.rank != 0:
        return
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "files": sample_files, "epoch": epoch,
             "rng": rng_state(), **extra}
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / f"ckpt_{step}.pt"
    tmp = checkpoint_dir / f".ckpt_{step}.pt.tmp"
    if runtime.kind == "xla":
        state = runtime.xm._maybe_convert_to_cpu(state)
    torch.save(state, tmp)
    os.replace(tmp, final)
    for _, old in checkpoints_in(checkpoint_dir)[:-keep]:
        old.unlink(missing_ok=True)
    log(f"checkpoint saved: {final}")


def load_checkpoint(path: Path, model, optimizer) -> int:
    """Restore model, optimizer and RNG states; return the step the checkpoint was taken at."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # Written before the RNG states were stored as plain types: our own file, trusted.
        log(f"{path} predates weights-only checkpoints: loading it with weights_only=False")
        state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    restore_rng(state["rng"])
    return int(state["step"])
