#!/usr/bin/env python3
"""BERT phase-1 pretraining (MLM + NSP) on HDF5 shards, data parallel, launched by torchrun.

Runs on Trainium (torch-xla), CUDA or CPU. The run script
run_dp_bert_large_hf_pretrain_bf16_s128.sh validates inputs and launches this program; see
README.md for the log lines and the results.json schema it produces.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import json
import math
import os
import queue
import random
import re
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

HDF5_KEYS = {
    "input_ids": ("int32", 2),
    "input_mask": ("int8", 2),
    "segment_ids": ("int8", 2),
    "masked_lm_positions": ("int32", 2),
    "masked_lm_ids": ("int32", 2),
    "next_sentence_labels": ("int8", 1),
}
COMMON_CONFIG = dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
                     hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, initializer_range=0.02,
                     layer_norm_eps=1e-12)
MODEL_SIZES = {
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=512),
}
CHECKPOINT_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")
NO_RESUME = {"resumes": 0, "steps_lost": 0, "history": []}
# Environment worth keeping in results.json to reproduce a run.
RECORDED_ENV_PREFIXES = ("SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_JOB_NODELIST",
                         "MASTER_", "WORLD_SIZE", "NEURON_", "XLA_", "FI_", "OMP_NUM_THREADS",
                         "TORCHINDUCTOR_CACHE_DIR", "SCALING_MODE", "COMPILE_ONLY",
                         "MODEL_SIZE")


class UsageError(Exception):
    """A problem with the inputs: reported as UC_ERROR, exit code 2."""


def log(message: str) -> None:
    print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


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
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto")
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


# ---------------------------------------------------------------- devices and distribution
class Runtime:
    """Device, backend and process-group facts for this worker."""

    def __init__(self):
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.xm = None
        try:
            import torch_xla.core.xla_model as xm
            import torch_xla.distributed.xla_backend  # noqa: F401  registers the "xla" backend
            self.xm = xm
            self.kind, self.backend = "xla", "xla"
        except ImportError:
            if torch.cuda.is_available():
                self.kind, self.backend = "cuda", "nccl"
            else:
                self.kind, self.backend = "cpu", "gloo"

    def start(self):
        if self.kind == "cuda":
            torch.cuda.set_device(self.local_rank)
        if self.world_size > 1:
            if self.kind == "xla":
                dist.init_process_group("xla", init_method="xla://")
            else:
                dist.init_process_group(self.backend, timeout=dt.timedelta(minutes=30))
        if self.kind == "xla":
            self.device = self.xm.xla_device()
        elif self.kind == "cuda":
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def bf16_supported(self) -> bool:
        if self.kind == "xla":
            return True
        if self.kind == "cuda":
            return torch.cuda.is_bf16_supported()
        return False  # CPU bf16 autocast is slower than fp32 without AMX/AVX512-BF16

    def mean_across_ranks(self, value: torch.Tensor) -> float:
        value = value.detach().clone()
        if self.distributed:
            dist.all_reduce(value)
            value /= self.world_size
        if self.kind == "xla":
            self.xm.mark_step()
        return float(value.item())

    def sum_across_ranks(self, value: int) -> int:
        total = torch.tensor(float(value), device=self.device)
        if self.distributed:
            dist.all_reduce(total)
        if self.kind == "xla":
            self.xm.mark_step()
        return int(round(total.item()))

    def barrier(self):
        if self.distributed:
            dist.barrier()

    def stop(self):
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


class LauncherWatch:
    """Stops a worker whose torchrun died (killed job, lost node).

    torchrun starts workers in sessions of their own, so killing the launcher's process group
    leaves them running; an orphan would keep training and race the retried job's checkpoints.
    """

    def __init__(self):
        under_launcher = "TORCHELASTIC_RUN_ID" in os.environ
        self.launcher_pid = os.getppid() if under_launcher else None

    def check(self):
        if self.launcher_pid is not None and os.getppid() != self.launcher_pid:
            try:
                log(f"launcher (pid {self.launcher_pid}) is gone: stopping this worker")
            except OSError:  # the log pipe may have died with the launcher
                pass
            os._exit(1)


def default_num_threads(runtime: Runtime) -> int:
    # Processes of one node split its CPUs; Slurm knows how many the node has.
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE", 0)) or os.cpu_count() or 1
    return max(1, cpus // max(1, runtime.local_world_size))


# ---------------------------------------------------------------- data
def list_training_files(data_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(data_dir, "*_training_*.hdf5")))


def check_shard_format(path: str, seq_len: int, max_pred_len: int) -> int:
    """Return the number of sequences; raise UsageError if the file is not the seed's format."""
    with h5py.File(path, "r") as f:
        rows = None
        for key, (dtype, ndim) in HDF5_KEYS.items():
            if key not in f:
                raise UsageError(f"{path}: missing dataset '{key}'")
            ds = f[key]
            width = max_pred_len if key.startswith("masked_lm_") else seq_len
            expected = f"[N,{width}]" if ndim == 2 else "[N]"
            if ds.ndim != ndim or (ndim == 2 and ds.shape[1] != width):
                raise UsageError(f"{path}: '{key}' has shape {ds.shape}, expected {expected}")
            if np.dtype(ds.dtype).kind != np.dtype(dtype).kind:
                raise UsageError(f"{path}: '{key}' has dtype {ds.dtype}, expected {dtype}")
            rows = ds.shape[0] if rows is None else rows
            if ds.shape[0] != rows:
                raise UsageError(f"{path}: datasets have different lengths")
        return rows


class ShardStream:
    """This rank's endless, deterministic stream of batches.

    Each epoch shuffles the file list with the seed and gives rank r the files r, r+W, ...;
    rows of a file are shuffled too, and a file's last partial batch is dropped. The stream can
    start at any micro-batch index without reading the skipped data (only shard lengths).
    """

    def __init__(self, files, rank, world_size, batch_size, seed):
        self.files, self.rank, self.world_size = files, rank, world_size
        self.batch_size, self.seed = batch_size, seed
        self._lengths = {}

    def _rank_files(self, epoch):
        order = list(self.files)
        random.Random(self.seed * 1000003 + epoch).shuffle(order)
        return order[self.rank::self.world_size]

    def _length(self, path):
        if path not in self._lengths:
            with h5py.File(path, "r") as f:
                self._lengths[path] = f["input_ids"].shape[0]
        return self._lengths[path]

    def batches(self, start_batch=0):
        """Yield (batch dict of numpy arrays, files finished so far by this rank)."""
        skip, files_done, epoch = start_batch, 0, 0
        while True:
            mine = self._rank_files(epoch)
            if not any(self._length(p) >= self.batch_size for p in mine):
                raise UsageError(f"rank {self.rank}: no shard holds a full batch of "
                                 f"{self.batch_size}")
            for file_index, path in enumerate(mine):
                n_batches = self._length(path) // self.batch_size
                if skip >= n_batches:
                    skip -= n_batches
                    files_done += 1
                    continue
                with h5py.File(path, "r") as f:
                    arrays = {key: f[key][()] for key in HDF5_KEYS}
                rows = np.random.default_rng([self.seed, epoch, file_index, self.rank])
                order = rows.permutation(len(arrays["input_ids"]))
                for b in range(skip, n_batches):
                    idx = np.sort(order[b * self.batch_size:(b + 1) * self.batch_size])
                    yield {k: v[idx] for k, v in arrays.items()}, files_done
                skip = 0
                files_done += 1
            epoch += 1


class Prefetcher:
    """Reads and converts batches in a background thread so the step never waits on disk."""

    def __init__(self, stream_iter, depth):
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.wait_seconds = 0.0
        self._thread = threading.Thread(target=self._fill, args=(stream_iter,), daemon=True)
        self._thread.start()

    def _fill(self, stream_iter):
        try:
            for arrays, files_done in stream_iter:
                batch = {k: torch.from_numpy(v.astype(np.int64)) for k, v in arrays.items()}
                while not self._stop.is_set():
                    try:
                        self._queue.put((batch, files_done), timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # surfaced in the training thread
            self._queue.put(exc)

    def next(self):
        start = time.perf_counter()
        item = self._queue.get()
        self.wait_seconds += time.perf_counter() - start
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------- model and optimisation
class PretrainingLoss(torch.nn.Module):
    """BertForPreTraining's MLM + NSP loss, scoring only the masked positions.

    Gathering the <= 20 masked positions before the vocabulary projection avoids computing
    128 x 30522 logits per sequence for nothing; the losses equal BertForPreTraining's.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids,
                next_sentence_labels):
        outputs = self.model.bert(input_ids=input_ids, attention_mask=input_mask,
                                  token_type_ids=segment_ids)
        hidden = outputs.last_hidden_state
        index = masked_lm_positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1))
        masked_hidden = torch.gather(hidden, 1, index)
        mlm_scores, nsp_scores = self.model.cls(masked_hidden, outputs.pooler_output)
        # Padding slots of masked_lm_ids are 0 ([PAD]), never a real prediction target.
        labels = masked_lm_ids.masked_fill(masked_lm_ids == 0, -100)
        mlm_loss = F.cross_entropy(mlm_scores.float().flatten(0, 1), labels.flatten(),
                                   ignore_index=-100)
        nsp_loss = F.cross_entropy(nsp_scores.float(), next_sentence_labels)
        return mlm_loss + nsp_loss


def build_model(size: str):
    from transformers import BertConfig, BertForPreTraining  # slow import: only when training
    config = BertConfig(**COMMON_CONFIG, **MODEL_SIZES[size])
    return BertForPreTraining(config), config


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019): Adam moments, update scaled per tensor by ||w|| / ||update||.

    Written with tensor ops only (no .item()) so it traces into one XLA graph.
    """

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                grad = p.grad.float()
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = exp_avg / (1 - beta1 ** state["step"])
                v_hat = exp_avg_sq / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p.float(), alpha=group["weight_decay"])
                weight_norm = p.float().norm()
                update_norm = update.norm()
                trust = torch.where((weight_norm > 0) & (update_norm > 0),
                                    weight_norm / update_norm, torch.ones_like(weight_norm))
                p.add_((update * trust * -group["lr"]).to(p.dtype))
        return loss


def build_optimizer(model, args):
    no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")
    decay, plain = [], []
    for name, param in model.named_parameters():
        (plain if name.endswith(no_decay) else decay).append(param)
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": plain, "weight_decay": 0.0}]
    if args.optimizer == "lamb":
        return Lamb(groups, lr=args.lr)
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-6)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup to the peak, then linear decay to 0 at max_steps (step counts from 0)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


# ---------------------------------------------------------------- checkpoints
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


def save_checkpoint(runtime, checkpoint_dir: Path, step, model, optimizer, keep, extra):
    """Rank 0 writes ckpt_<step>.pt atomically and keeps the newest `keep` checkpoints."""
    if runtime.rank != 0:
        return
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                     "torch": torch.get_rng_state()}, **extra}
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


# ---------------------------------------------------------------- compile cache
class CompileCache:
    """Counts compile-cache hits and misses for results.json."""

    def __init__(self, runtime, use_torch_compile, cache_dir):
        self.runtime, self.cache_dir = runtime, cache_dir
        self.backend = "none"
        if runtime.kind == "xla":
            self.backend = "neuron"
        elif use_torch_compile:
            self.backend = "torch.compile"
        self._neffs_before = self._count_neffs()

    def _count_neffs(self):
        url = os.environ.get("NEURON_COMPILE_CACHE_URL", "")
        if self.runtime.kind != "xla" or not url or url.startswith("s3://"):
            return None
        return sum(1 for _ in Path(url).rglob("*.neff")) if Path(url).is_dir() else 0

    def stats(self):
        hits = misses = None
        if self.backend == "torch.compile":
            from torch._dynamo.utils import counters
            hits = int(counters["inductor"]["fxgraph_cache_hit"])
            misses = int(counters["inductor"]["fxgraph_cache_miss"])
        elif self.backend == "neuron":
            after = self._count_neffs()
            if after is not None:
                misses = after - self._neffs_before  # each new NEFF is one graph compiled
        elif self.backend == "none":
            hits = misses = 0
        return {"backend": self.backend, "cache_dir": self.cache_dir or None,
                "hits": hits, "misses": misses}


# ---------------------------------------------------------------- results.json
def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def metric(name, value, units, additional=None):
    return {"MetricName": name, "MeasuredValue": value, "Units": units,
            "Timestamp": now_iso(), "AdditionalData": additional or {}}


def write_json_atomically(path: Path, document) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- training
def train(args, runtime: Runtime) -> int:
    files = list_training_files(args.data_dir)
    if not files:
        raise UsageError(f"no *_training_*.hdf5 files in {args.data_dir}")
    if runtime.world_size > len(files):
        raise UsageError(f"world size {runtime.world_size} exceeds the {len(files)} training "
                         f"files in {args.data_dir}: each worker needs at least one file")
    check_shard_format(files[0], args.seq_len, args.max_pred_len)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if runtime.kind == "cpu":
        torch.set_num_threads(args.num_threads or default_num_threads(runtime))

    output_dir = Path(args.output_dir)
    checkpoint_dir = output_dir / "checkpoints"
    metrics_file = Path(args.metrics_file) if args.metrics_file else output_dir / "results.json"
    use_bf16 = args.dtype == "bf16" or (args.dtype == "auto" and runtime.bf16_supported())
    use_torch_compile = args.torch_compile == "on" or (
        args.torch_compile == "auto" and runtime.kind == "cuda")

    model, config = build_model(args.model_size)
    model.to(runtime.device)
    optimizer = build_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, args.warmup_steps, args.max_steps))

    start_step = 0
    resumed_from = find_resume_checkpoint(args, checkpoint_dir)
    if resumed_from is not None:
        state = torch.load(resumed_from, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = int(state["step"])
        scheduler.last_epoch = start_step - 1
        scheduler.step()  # sets the lr for start_step
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        if runtime.rank == 0:
            log(f"resuming from {resumed_from} at step {start_step}")

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
    micro_batches_done = start_step * args.grad_accum_usteps
    stream = ShardStream(files, runtime.rank, runtime.world_size, args.batch_size, args.seed)
    prefetcher = Prefetcher(stream.batches(start_batch=micro_batches_done), args.prefetch_batches)
    autocast = (torch.autocast(device_type=runtime.device.type, dtype=torch.bfloat16)
                if use_bf16 and runtime.kind == "cuda" else contextlib.nullcontext())

    if runtime.rank == 0:
        log(f"device={runtime.kind} backend={runtime.backend} world_size={runtime.world_size} "
            f"model={args.model_size} params={sum(p.numel() for p in model.parameters())} "
            f"global_batch={global_batch} steps={start_step}->{end_step} "
            f"bf16={use_bf16} torch_compile={use_torch_compile}")

    loss_metrics, throughput_metrics = [], []
    # About 200 Loss/Throughput points per run, taken at logged steps.
    metrics_every = args.log_every * max(1, math.ceil((end_step - start_step) / 200 / args.log_every))
    peak_throughput = 0.0
    last_loss = None
    sequences_seen = 0  # rows this rank really trained on
    last_files_ckpt = 0
    step = start_step
    loop_start = interval_start = time.perf_counter()
    interval_steps = 0
    first_step_seconds = None
    launcher = LauncherWatch()
    try:
        while step < end_step:
            step_start = time.perf_counter()
            step_loss = torch.zeros((), device=runtime.device)
            files_done = 0
            for micro in range(args.grad_accum_usteps):
                launcher.check()
                batch, files_done = prefetcher.next()
                sequences_seen += batch["input_ids"].shape[0]
                batch = {k: v.to(runtime.device, non_blocking=True) for k, v in batch.items()}
                last_micro = micro == args.grad_accum_usteps - 1
                # Gradients are all-reduced on the last micro-step only.
                sync = ddp.no_sync() if (ddp is not None and not last_micro) \
                    else contextlib.nullcontext()
                with sync, autocast:
                    loss = forward(**batch) / args.grad_accum_usteps
                loss.backward()
                step_loss += loss.detach()
                if runtime.kind == "xla":
                    runtime.xm.mark_step()
            if runtime.kind == "xla":
                runtime.xm.reduce_gradients(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            current_lr = scheduler.get_last_lr()[0]
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if runtime.kind == "xla":
                runtime.xm.mark_step()
            step += 1
            interval_steps += 1
            if first_step_seconds is None:
                first_step_seconds = time.perf_counter() - step_start

            is_last = step == end_step
            if step % args.log_every == 0 or is_last:
                last_loss = runtime.mean_across_ranks(step_loss)
                now = time.perf_counter()
                throughput = global_batch * interval_steps / (now - interval_start)
                steps_timed = step - start_step - 1
                # The first step carries warm-up (compilation, allocations); ETA uses the rest.
                per_step = ((now - loop_start - first_step_seconds) / steps_timed
                            if steps_timed > 0 else now - loop_start)
                eta = per_step * (end_step - step)
                if step - start_step > 1 or is_last:
                    peak_throughput = max(peak_throughput, throughput)
                if runtime.rank == 0:
                    print(f"UC_PROGRESS step={step} total={end_step} loss={last_loss:.6f} "
                          f"lr={current_lr:.6f} throughput={throughput:.2f} "
                          f"eta_s={int(round(eta))}", flush=True)
                    if step % metrics_every == 0 or is_last:
                        loss_metrics.append(metric("Loss", last_loss, "", {"step": step}))
                        throughput_metrics.append(
                            metric("Throughput", throughput, "seq/s", {"step": step}))
                interval_start, interval_steps = now, 0

            if not args.compile_only:
                rank0_files = files_done
                by_shards = (args.shards_per_ckpt > 0
                             and rank0_files - last_files_ckpt >= args.shards_per_ckpt)
                if by_shards:
                    last_files_ckpt = rank0_files
                if step % args.steps_per_ckpt == 0 or is_last or by_shards:
                    save_checkpoint(runtime, checkpoint_dir, step, model, optimizer,
                                    args.num_ckpts_to_keep,
                                    {"world_size": runtime.world_size,
                                     "grad_accum_usteps": args.grad_accum_usteps,
                                     "batch_size": args.batch_size})
    finally:
        prefetcher.close()
    train_seconds = time.perf_counter() - loop_start
    sequences_processed = runtime.sum_across_ranks(sequences_seen)

    if runtime.rank == 0:
        steps_done = step - start_step
        cache = compile_cache.stats()
        average = global_batch * steps_done / train_seconds if steps_done else 0.0
        env = {k: v for k, v in sorted(os.environ.items())
               if k.startswith(RECORDED_ENV_PREFIXES)}
        parameters = {
            "Model": f"BERT-{args.model_size} (BertForPreTraining, MLM+NSP)",
            "Model configuration": {k: getattr(config, k) for k in
                                    [*COMMON_CONFIG, *MODEL_SIZES[args.model_size]]},
            "World size": runtime.world_size,
            "Data parallel degree": runtime.world_size,
            "Batch size": args.batch_size,
            "Total steps": args.max_steps,
            "Seed": args.seed,
            "Optimizer": {"adamw": "AdamW", "lamb": "LAMB"}[args.optimizer],
            "Data type": "bf16" if use_bf16 else "fp32",
            "Gradient accumulation microsteps": args.grad_accum_usteps,
            "Warmup steps": args.warmup_steps,
            "Shards per checkpoint": args.shards_per_ckpt,
            "Dataset": os.path.abspath(args.data_dir),
            "Environment variables": env,
            "Sequence length": args.seq_len,
            "Learning rate": args.lr,
            "Max predictions per sequence": args.max_pred_len,
            "Device": runtime.kind,
            "Scaling mode": args.scaling_mode,
            "Number of nodes": args.num_nodes,
            "Global batch size": global_batch,
            "Start step": start_step,
            "End step": step,
            "Resumed from": str(resumed_from) if resumed_from else None,
            "Compile only": args.compile_only,
            # How parallel_compile ran: {"mode": neuron_parallel_compile|compile_only, "path"} (COMPILE_LAUNCH).
            "Compile step": json.loads(os.environ.get("COMPILE_LAUNCH") or "null"),
            # The scaling-sweep point this run trained (SWEEP_POINT, JSON from the pipeline), or None.
            "Sweep": json.loads(os.environ.get("SWEEP_POINT") or "null"),
            # Resumes after node faults so far and the steps they lost (AUTO_RESUME, from the pipeline).
            "Auto resume": json.loads(os.environ.get("AUTO_RESUME") or "null") or NO_RESUME,
        }
        metrics = loss_metrics + throughput_metrics + [
            metric("Final loss", last_loss, "", {"step": step}),
            metric("Time to train", train_seconds / 60.0, "minutes", {"steps": steps_done}),
            metric("Average throughput", average, "seq/s", {"steps": steps_done}),
            metric("Peak throughput", peak_throughput, "seq/s", {}),
            metric("Sequences processed", sequences_processed, "sequences",
                   {"steps": steps_done, "all ranks": True}),
            metric("Global batch size", global_batch, "sequences",
                   {"formula": "batch_size * grad_accum_usteps * world_size"}),
            metric("Scaling mode", args.scaling_mode, "", {}),
            metric("Number of nodes", args.num_nodes, "nodes", {}),
            metric("Compile cache hits", cache["hits"], "graphs", cache),
            metric("Compile cache misses", cache["misses"], "graphs", cache),
            metric("Data loader wait", prefetcher.wait_seconds, "seconds",
                   {"rank": 0, "first_step_seconds": first_step_seconds}),
        ]
        write_json_atomically(metrics_file, {"results": {"parameters": parameters,
                                                         "metrics": metrics}})
        print(f"UC_COMPILE_CACHE backend={cache['backend']} hits={cache['hits']} "
              f"misses={cache['misses']}", flush=True)
        print(f"UC_RESULTS {metrics_file.resolve()}", flush=True)
    return 0


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
