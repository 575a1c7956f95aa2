"""Benchmark 5, input pipeline: training throughput of the tiny model fed by the real HDF5 loader
(ShardStream + Prefetcher, as the job runs it) against the same batches pre-built in memory, with
the same steps, interleaved in the same run, with one torch thread (--num_threads). Runs in the
training venv:
    .venvs/training/bin/python bench/input_pipeline.py --data_dir <dataset dir>
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import numpy as np
from _record import REPO, Report, summary  # noqa: E402

TARGET_RATIO = 0.97


def load_training_module():
    path = REPO / "include" / "training" / "dp_bert_large_hf_pretrain_hdf5.py"
    spec = importlib.util.spec_from_file_location("uc_training", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_steps(t, args, batches, waited=lambda: 0.0) -> tuple[float, float]:
    """Sequences per second over args.steps optimizer steps after one untimed warm-up step, and the
    fraction of that time the step waited for a batch (waited(): seconds so far)."""
    import torch

    torch.manual_seed(args.seed)
    model, _ = t.build_model("tiny")
    loss_module = t.PretrainingLoss(model)
    optimizer = t.build_optimizer(model, args)
    sequences, start, waited0 = 0, None, 0.0
    for step in range(args.steps + 1):
        if step == 1:
            sequences, start, waited0 = 0, time.perf_counter(), waited()
        for _ in range(args.grad_accum_usteps):
            batch = batches()
            sequences += batch["input_ids"].shape[0]
            (loss_module(**batch) / args.grad_accum_usteps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    return sequences / elapsed, (waited() - waited0) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--repetitions", type=int, default=9)
    parser.add_argument("--steps", type=int, default=12)
    # One torch thread, as the local profile gives a training rank (TORCH_NUM_THREADS=1): the loader's
    # thread gets the other core, as a Trn1 host's CPUs feed accelerators that do the compute. With
    # torch on both cores the ratio measures this 2-core machine's contention, not the loader.
    parser.add_argument("--num_threads", type=int, default=1)
    options, rest = parser.parse_known_args()
    t = load_training_module()
    import torch

    args = t.parse_args(["--model_size", "tiny", "--batch_size", "8", "--grad_accum_usteps", "2",
                         "--data_dir", options.data_dir, "--output_dir", "/nonexistent-unused", *rest])
    args.steps = options.steps
    torch.set_num_threads(options.num_threads)
    files = t.list_training_files(args.data_dir)
    micro_batches = (args.steps + 1) * args.grad_accum_usteps

    def real_loader():
        prefetcher = t.Prefetcher(t.ShardStream(files, 0, 1, args.batch_size, args.seed).batches(),
                                  args.prefetch_batches)
        return lambda: prefetcher.next()[0], prefetcher

    stream = t.ShardStream(files, 0, 1, args.batch_size, args.seed).batches()
    in_memory = [{k: torch.from_numpy(v.astype(np.int64)) for k, v in next(stream)[0].items()}
                 for _ in range(micro_batches)]

    real, memory, stalls = [], [], []
    for repetition in range(options.repetitions):
        for kind in (("real", "memory") if repetition % 2 == 0 else ("memory", "real")):
            if kind == "real":
                feed, prefetcher = real_loader()
                try:
                    rate, stall = run_steps(t, args, feed, lambda: prefetcher.wait_seconds)
                    real.append(rate)
                    stalls.append(stall)
                finally:
                    prefetcher.close()
            else:
                items = iter(in_memory)
                memory.append(run_steps(t, args, lambda: next(items))[0])
    report = Report("input_pipeline", f"5. Input pipeline (tiny model, same steps, interleaved, "
                                      f"{options.num_threads} torch thread(s))")
    report.figure("HDF5 loader throughput", summary(real), "seq/s")
    report.figure("in-memory batches throughput", summary(memory), "seq/s")
    report.figure("ratio loader / in-memory", summary([r / m for r, m in zip(real, memory)]), "x",
                  f">= {TARGET_RATIO}")
    report.figure("time the step waited for the loader", summary([100 * x for x in stalls]), "%",
                  note="Prefetcher.wait_seconds over the timed steps: the loader starving the step")
    report.save()


if __name__ == "__main__":
    main()
