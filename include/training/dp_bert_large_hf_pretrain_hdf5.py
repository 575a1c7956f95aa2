#!/usr/bin/env python3
"""BERT phase-1 pretraining (MLM + NSP) on HDF5 shards, data parallel, launched by torchrun.

Runs on Trainium (torch-xla), CUDA or CPU. The run script
run_dp_bert_large_hf_pretrain_bf16_s128.sh validates inputs and launches this program; see
README.md for the log lines and the results.json schema it produces. The pretrain_*.py modules
beside it hold its parts.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the pretrain_* modules beside it

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pretrain_checkpoint import (CHECKPOINT_PATTERN, checkpoints_in,  # noqa: E402,F401
                                 find_resume_checkpoint, load_checkpoint, save_checkpoint)
from pretrain_data import (HDF5_KEYS, DeviceFeed, Prefetcher, ShardStream,  # noqa: E402,F401
                           check_shard_format, list_training_files)
from pretrain_model import (COMMON_CONFIG, MODEL_SIZES, AdamW, Lamb,  # noqa: E402,F401
                            PretrainingLoss, build_model, build_optimizer, lr_factor,
                            parameter_count, place_model, weights_tied)
from pretrain_report import (NO_RESUME, CompileCache, Progress, env_json, metric, node_health,  # noqa: E402
                             recorded_env, write_json_atomically)
from pretrain_runtime import (LauncherWatch, Runtime, UsageError,  # noqa: E402
                              default_num_threads, log)

# Test switch: log the device-to-host transfers of every step (torch_xla's metrics).
DEBUG_HOST_TRANSFERS = "UC_DEBUG_HOST_TRANSFERS"
# Read by torch-xla/Neuron up to release 2.24 only; bf16 is now --dtype (the model is cast).
RETIRED_BF16_VARIABLES = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--metrics_file", help="results.json path (default: OUTPUT_DIR/results.json)")
    p.add_argument("--model_size", choices=sorted(MODEL_SIZES), default="large")
    p.add_argument("--max_steps", type=int, default=28125)
    p.add_argument("--steps_this_run", type=int, default=-1,
                   help="optimizer steps in this invocation (-1: up to max_steps)")
    p.add_argument("--batch_size", type=int, default=16, help="per worker, per micro-step")
    p.add_argument("--grad_accum_usteps", type=int, default=32)
    p.add_argument("--optimizer", choices=["adamw", "lamb"], default="adamw")
    p.add_argument("--lr", type=float, default=None, help="default 4e-4 (AdamW), 6e-3 (LAMB)")
    p.add_argument("--warmup_steps", type=int, default=2000)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=12349)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--max_pred_len", type=int, default=20)
    p.add_argument("--steps_per_ckpt", type=int, default=1000)
    p.add_argument("--shards_per_ckpt", type=int, default=0,
                   help="also checkpoint each time rank 0 has consumed this many shard files")
    p.add_argument("--num_ckpts_to_keep", type=int, default=1)
    p.add_argument("--resume_dir", default="",
                   help="another output dir whose checkpoints may be resumed from")
    p.add_argument("--resume_ckpt", default="", help="an explicit checkpoint file to resume")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 on XLA (the model cast, fp32 optimizer states), CUDA autocast "
                        "where supported, fp32 on CPU")
    p.add_argument("--torch_compile", choices=["auto", "on", "off"], default="auto",
                   help="auto: on for CUDA, off for CPU (measured: it does not pay, README)")
    p.add_argument("--compile_only", action="store_true",
                   help="a few steps to fill the compile cache; no checkpoints")
    p.add_argument("--compile_cache_dir", default="")
    p.add_argument("--scaling_mode", choices=["strong", "weak"], default="strong")
    p.add_argument("--num_nodes", type=int, default=1)
    p.add_argument("--log_every", type=int, default=1)
    p.add_argument("--num_threads", type=int, default=0, help="CPU threads (0: derive)")
    p.add_argument("--prefetch_batches", type=int, default=8)
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = 6e-3 if args.optimizer == "lamb" else 4e-4
    for name in ("max_steps", "batch_size", "grad_accum_usteps", "steps_per_ckpt",
                 "num_ckpts_to_keep", "log_every", "num_nodes"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def dtype_name(dtype) -> str | None:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))


class HostTransfers:
    """Device-to-host transfers per step, from torch_xla's TransferFromDeviceTime metric."""

    def __init__(self, runtime):
        self.enabled = runtime.kind == "xla" and os.environ.get(DEBUG_HOST_TRANSFERS) == "1"
        if self.enabled:
            import torch_xla.debug.metrics as met
            self.met, self.before = met, self._count(met)

    @staticmethod
    def _count(met) -> int:
        data = met.metric_data("TransferFromDeviceTime")
        return int(data[0]) if data else 0

    def step_done(self, step):
        if self.enabled:
            now = self._count(self.met)
            log(f"UC_DEBUG step={step} device_to_host={now - self.before}")
            self.before = now


def train(args, runtime: Runtime) -> int:
    retired = [name for name in RETIRED_BF16_VARIABLES if name in os.environ]
    if retired:
        raise UsageError(f"{', '.join(retired)} set: Neuron 2.24 was the last release to read it; "
                         "bf16 is the default on XLA (--dtype auto casts the model)")
    files = list_training_files(args.data_dir)
    if not files:
        raise UsageError(f"no *_training_*.hdf5 files in {args.data_dir}")
    if runtime.world_size > len(files):
        raise UsageError(f"world size {runtime.world_size} exceeds the {len(files)} training "
                         f"files in {args.data_dir}: each worker needs at least one file")
    check_shard_format(files[0], args.seq_len, args.max_pred_len)
    try:  # read before training: an unreadable report fails now, not after hours of it
        health = node_health() if runtime.rank == 0 else None
    except ValueError as err:
        raise UsageError(str(err)) from None

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if runtime.kind == "cpu":
        torch.set_num_threads(args.num_threads or default_num_threads(runtime))

    output_dir = Path(args.output_dir)
    checkpoint_dir = output_dir / "checkpoints"
    metrics_file = Path(args.metrics_file) if args.metrics_file else output_dir / "results.json"
    use_bf16 = args.dtype == "bf16" or (args.dtype == "auto" and runtime.bf16_supported())
    # CUDA keeps fp32 weights under bf16 autocast (no stochastic rounding there); elsewhere bf16
    # means the weights are bf16, as the Neuron sample casts them.
    autocast_bf16 = use_bf16 and runtime.kind == "cuda"
    use_torch_compile = args.torch_compile == "on" or (
        args.torch_compile == "auto" and runtime.kind == "cuda")

    model, config = build_model(args.model_size, "eager" if runtime.kind == "xla" else None)
    params_built = parameter_count(model)
    place_model(model, runtime.device, torch.bfloat16 if use_bf16 and not autocast_bf16 else None)
    optimizer = build_optimizer(model, args, tensor_only=runtime.kind == "xla")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, args.warmup_steps, args.max_steps))

    start_step = 0
    resumed_from = find_resume_checkpoint(args, checkpoint_dir)
    if resumed_from is not None:
        start_step = load_checkpoint(resumed_from, model, optimizer)
        scheduler.last_epoch = start_step - 1
        scheduler.step()  # sets the lr for start_step
        if runtime.rank == 0:
            log(f"resuming from {resumed_from} at step {start_step}")
    collective_check = runtime.check_collectives()

    loss_module = PretrainingLoss(model)
    if use_torch_compile:
        loss_module = torch.compile(loss_module)
    ddp = None
    if runtime.distributed and runtime.kind != "xla":
        ddp = torch.nn.parallel.DistributedDataParallel(
            loss_module, device_ids=[runtime.local_rank] if runtime.kind == "cuda" else None)
    forward = ddp or loss_module
    compile_cache = CompileCache(runtime, use_torch_compile, args.compile_cache_dir)

    end_step = args.max_steps
    if args.steps_this_run > 0:
        end_step = min(args.max_steps, start_step + args.steps_this_run)
    global_batch = args.batch_size * args.grad_accum_usteps * runtime.world_size
    stream = ShardStream(files, runtime.rank, runtime.world_size, args.batch_size, args.seed)
    prefetcher = Prefetcher(stream.batches(start_batch=start_step * args.grad_accum_usteps),
                            args.prefetch_batches)
    feed = DeviceFeed(prefetcher, runtime)
    autocast = (torch.autocast(device_type="cuda", dtype=torch.bfloat16)
                if autocast_bf16 else contextlib.nullcontext())
    data_type = dtype_name(next(model.parameters()).dtype)

    if runtime.rank == 0:
        log(f"device={runtime.kind} backend={runtime.backend} world_size={runtime.world_size} "
            f"model={args.model_size} params={parameter_count(model)} (built: {params_built}) "
            f"tied={weights_tied(model)} dtype={data_type} global_batch={global_batch} "
            f"steps={start_step}->{end_step} autocast_bf16={autocast_bf16} "
            f"torch_compile={use_torch_compile} collective_check=ok")

    progress = Progress(runtime.rank, start_step, end_step, global_batch, args.log_every)
    transfers = HostTransfers(runtime)
    sequences_seen = 0  # rows this rank really trained on
    last_files_ckpt = 0
    step = start_step
    launcher = LauncherWatch()
    try:
        while step < end_step:
            step_loss = torch.zeros((), device=runtime.device)
            for micro in range(args.grad_accum_usteps):
                launcher.check()
                batch, position = feed.next()
                sequences_seen += batch["input_ids"].shape[0]
                last_micro = micro == args.grad_accum_usteps - 1
                # DDP all-reduces the gradients on the last micro-step only.
                sync = ddp.no_sync() if (ddp is not None and not last_micro) \
                    else contextlib.nullcontext()
                with sync, autocast:
                    loss = forward(**batch) / args.grad_accum_usteps
                loss.backward()
                step_loss += loss.detach()
                runtime.sync()
            runtime.reduce_gradients(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            current_lr = scheduler.get_last_lr()[0]
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            logging = step % args.log_every == 0 or step == end_step
            # On XLA every step reduces the loss, so every step is the same graph (one compile).
            if logging or runtime.kind == "xla":
                reduced_loss = runtime.mean_loss(step_loss)
            if logging:
                runtime.add_step_closure(progress.report, (reduced_loss, step, current_lr))
            runtime.sync()
            progress.step_done(step)

            if not args.compile_only:
                by_shards = (args.shards_per_ckpt > 0
                             and position.files_done - last_files_ckpt >= args.shards_per_ckpt)
                if by_shards:
                    last_files_ckpt = position.files_done
                if step % args.steps_per_ckpt == 0 or step == end_step or by_shards:
                    save_checkpoint(runtime, checkpoint_dir, step, model, optimizer, scheduler,
                                    args.num_ckpts_to_keep,
                                    {"world_size": runtime.world_size,
                                     "grad_accum_usteps": args.grad_accum_usteps,
                                     "batch_size": args.batch_size},
                                    [position.file_index, *stream.epoch_files(position.epoch)],
                                    position.epoch)
            transfers.step_done(step)
    finally:
        feed.close()
    train_seconds = time.perf_counter() - progress.loop_start
    sequences_processed = runtime.sum_across_ranks(sequences_seen)
    if runtime.distributed:
        fingerprint = runtime.check_replicas_in_sync(model)
        if runtime.rank == 0:
            log(f"replicas in sync: {runtime.world_size} ranks, weight fingerprint {fingerprint!r}")

    if runtime.rank == 0:
        optimizer_states = [s["exp_avg"].dtype for s in optimizer.state.values() if "exp_avg" in s]
        facts = dict(config=config, collective_check=collective_check, health=health, data_type=data_type,
                     autocast="bf16" if autocast_bf16 else None, params=parameter_count(model),
                     optimizer_state=dtype_name(optimizer_states[0]) if optimizer_states else None,
                     global_batch=global_batch, start_step=start_step, step=step,
                     resumed_from=resumed_from, train_seconds=train_seconds,
                     sequences_processed=sequences_processed, cache=compile_cache.stats(),
                     wait_seconds=feed.wait_seconds)
        write_json_atomically(metrics_file, results_document(args, runtime, progress, facts))
        cache = facts["cache"]
        print(f"UC_COMPILE_CACHE backend={cache['backend']} hits={cache['hits']} "
              f"misses={cache['misses']}", flush=True)
        print(f"UC_RESULTS {metrics_file.resolve()}", flush=True)
    return 0


def results_document(args, runtime, progress, f) -> dict:
    steps_done = f["step"] - f["start_step"]
    average = f["global_batch"] * steps_done / f["train_seconds"] if steps_done else 0.0
    parameters = {
        "Model": f"BERT-{args.model_size} (BertForPreTraining, MLM+NSP)",
        "Model configuration": {k: getattr(f["config"], k) for k in
                                [*COMMON_CONFIG, *MODEL_SIZES[args.model_size]]},
        "World size": runtime.world_size,
        "Data parallel degree": runtime.world_size,
        "Batch size": args.batch_size,
        "Total steps": args.max_steps,
        "Seed": args.seed,
        "Optimizer": {"adamw": "AdamW", "lamb": "LAMB"}[args.optimizer],
        # The dtype the weights really have (bf16: the model was cast).
        "Data type": f["data_type"],
        "Autocast": f["autocast"],
        "Optimizer state data type": f["optimizer_state"],
        "Parameter count": f["params"],
        "Collective check": f["collective_check"],
        # The node health gate's per-node checks (node_health.sh), or None; its third check is the above.
        "Node health": f["health"],
        "Gradient accumulation microsteps": args.grad_accum_usteps,
        "Warmup steps": args.warmup_steps,
        "Shards per checkpoint": args.shards_per_ckpt,
        "Dataset": os.path.abspath(args.data_dir),
        "Environment variables": recorded_env(),
        "Sequence length": args.seq_len,
        "Learning rate": args.lr,
        "Max predictions per sequence": args.max_pred_len,
        "Device": runtime.kind,
        "Scaling mode": args.scaling_mode,
        "Number of nodes": args.num_nodes,
        "Global batch size": f["global_batch"],
        "Start step": f["start_step"],
        "End step": f["step"],
        "Resumed from": str(f["resumed_from"]) if f["resumed_from"] else None,
        "Compile only": args.compile_only,
        # How parallel_compile ran: {"mode": neuron_parallel_compile|compile_only, "path"} (COMPILE_LAUNCH).
        "Compile step": env_json("COMPILE_LAUNCH"),
        # The scaling-sweep point this run trained (SWEEP_POINT, JSON from the pipeline), or None.
        "Sweep": env_json("SWEEP_POINT"),
        # Resumes after node faults so far and the steps they lost (AUTO_RESUME, from the pipeline).
        "Auto resume": env_json("AUTO_RESUME", NO_RESUME),
    }
    cache = f["cache"]
    metrics = progress.loss_metrics + progress.throughput_metrics + [
        metric("Final loss", progress.last_loss, "", {"step": f["step"]}),
        metric("Time to train", f["train_seconds"] / 60.0, "minutes", {"steps": steps_done}),
        metric("Average throughput", average, "seq/s", {"steps": steps_done}),
        metric("Peak throughput", progress.peak_throughput, "seq/s", {}),
        metric("Sequences processed", f["sequences_processed"], "sequences",
               {"steps": steps_done, "all ranks": True}),
        metric("Global batch size", f["global_batch"], "sequences",
               {"formula": "batch_size * grad_accum_usteps * world_size"}),
        metric("Scaling mode", args.scaling_mode, "", {}),
        metric("Number of nodes", args.num_nodes, "nodes", {}),
        metric("Compile cache hits", cache["hits"], "graphs", cache),
        metric("Compile cache misses", cache["misses"], "graphs", cache),
        metric("Data loader wait", f["wait_seconds"], "seconds",
               {"rank": 0, "first_step_seconds": progress.first_step_seconds}),
        metric("First step", progress.first_step_seconds, "seconds",
               {"at": progress.first_step_at, "step": f["start_step"] + 1 if progress.first_step_at else None}),
    ]
    return {"results": {"parameters": parameters, "metrics": metrics}}


def main(argv=None) -> int:
    runtime = Runtime()
    try:
        args = parse_args(argv)
        runtime.start()
        return train(args, runtime)
    except UsageError as exc:
        print(f"UC_ERROR {exc}", flush=True)
        return 2
    finally:
        runtime.stop()


if __name__ == "__main__":
    sys.exit(main())
