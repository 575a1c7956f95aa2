"""Devices, process group and collectives for the training program (torch-xla, CUDA or CPU).

Every collective the program uses goes through Runtime, so each runtime reduces the same way:
on XLA with torch_xla's own collectives (as the Neuron sample does), elsewhere with torch.distributed.
"""
from __future__ import annotations

import datetime as dt
import os
import sys

import torch
import torch.distributed as dist

# Test switch: this rank adds 0 instead of 1 to the start-up all-reduce, as a rank missing from the
# group would; the check must then fail.
FAULT_COLLECTIVE_CHECK = "UC_FAULT_COLLECTIVE_CHECK"


class UsageError(Exception):
    """A problem with the inputs or the cluster: reported as UC_ERROR, exit code 2."""


def log(message: str) -> None:
    print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


class Runtime:
    """Device, backend and process-group facts for this worker."""

    def __init__(self):
        # What the launcher (torchrun) says; the process group must agree (check_collectives).
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.xm = None
        try:
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.distributed.xla_backend  # noqa: F401  registers the "xla" backend
            self.torch_xla, self.xm = torch_xla, xm
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
            self.device = self.torch_xla.device()
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
        return False  # CPU bf16 is slower than fp32 without AMX/AVX512-BF16

    # ------------------------------------------------------------ collectives (on the device)
    def all_reduce(self, value: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduce over the job's ranks without a host sync; returns the reduced tensor."""
        if self.kind == "xla":
            reduce_op = {"sum": self.xm.REDUCE_SUM, "max": self.xm.REDUCE_MAX,
                         "min": self.xm.REDUCE_MIN}[op]
            return self.xm.all_reduce(reduce_op, value)
        value = value.clone()
        if self.distributed:
            dist.all_reduce(value, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                       "min": dist.ReduceOp.MIN}[op])
        return value

    def mean_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The mean over ranks, as the sample reduces it: the sum of loss / world size."""
        return self.all_reduce(loss.detach() / self.world_size)

    def reduce_gradients(self, optimizer) -> None:
        """XLA: all-reduce (mean) the gradients; DDP does it elsewhere during backward."""
        if self.kind == "xla" and self.distributed:
            self.xm.reduce_gradients(optimizer)

    def sum_across_ranks(self, value: int) -> int:
        total = self.all_reduce(torch.tensor(float(value), device=self.device))
        self.sync()
        return int(round(total.item()))

    # ------------------------------------------------------------ XLA graph boundaries
    def sync(self) -> None:
        """XLA: cut the traced graph here and run it (step closures run after it); no-op elsewhere."""
        if self.kind == "xla":
            self.torch_xla.sync()

    def add_step_closure(self, fn, args) -> None:
        """XLA: run fn(*args) once this step's graph has run (its tensors are then ready);
        elsewhere at once."""
        if self.kind == "xla":
            self.xm.add_step_closure(fn, args)
        else:
            fn(*args)

    # ------------------------------------------------------------ checks
    def check_collectives(self) -> dict:
        """Before the first step: every rank all-reduces a one; the sum must be the world size.

        Catches a process group that is not the job (a misconfigured EFA or rendezvous, or a
        runtime whose collectives do not reach the other processes).
        """
        contribution = 1.0
        fault = os.environ.get(FAULT_COLLECTIVE_CHECK, "")
        if fault != "" and int(fault) == self.rank:
            contribution = 0.0
        total = self.all_reduce(torch.tensor(contribution, device=self.device))
        self.sync()
        result = total.item()
        group = (f"{dist.get_rank()} of {dist.get_world_size()}"
                 if dist.is_available() and dist.is_initialized() else "none")
        if result != self.world_size:
            raise UsageError(
                f"collective check failed on rank {self.rank}: the all-reduce of ones over ranks "
                f"0-{self.world_size - 1} gave {result:g}, expected the world size {self.world_size} "
                f"(backend {self.backend}, world size {self.world_size}, process group: rank {group})"
                + (f"; {FAULT_COLLECTIVE_CHECK} is set" if fault != "" else ""))
        return {"backend": self.backend, "world_size": self.world_size, "result": int(result)}

    def check_replicas_in_sync(self, model) -> float:
        """After training: the ranks' weights must be identical (gradients were all-reduced)."""
        fingerprint = torch.stack([p.detach().float().sum() for p in model.parameters()]).sum()
        low, high = self.all_reduce(fingerprint, "min"), self.all_reduce(fingerprint, "max")
        self.sync()
        low, high = low.item(), high.item()
        if low != high:
            raise UsageError(f"the {self.world_size} ranks' weights differ after training "
                             f"(fingerprints {low!r} to {high!r}): gradients were not all-reduced")
        return high

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
