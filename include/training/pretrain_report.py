"""What the run reports: UC_PROGRESS lines, the compile-cache statistics and results.json."""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import time
from pathlib import Path

NO_RESUME = {"resumes": 0, "steps_lost": 0, "history": [], "nodes_lost": {}}
# The node health gate's line per node (node_health.sh; plugins/ultracluster/run/health.py parses it too).
HEALTH_PREFIX = "UC_HEALTH "
# Environment worth keeping in results.json to reproduce a run.
RECORDED_ENV_PREFIXES = ("SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_JOB_NODELIST",
                         "MASTER_", "WORLD_SIZE", "NEURON_", "XLA_", "FI_", "OMP_NUM_THREADS",
                         "TORCHINDUCTOR_CACHE_DIR", "SCALING_MODE", "COMPILE_ONLY",
                         "MODEL_SIZE", "BUCKET_CAP_MB", "PJRT_DEVICE")


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


class Progress:
    """UC_PROGRESS lines and the Loss/Throughput metrics, from rank 0's reduced step losses.

    report() runs in a step closure on XLA, once the step's graph has run: reading the loss there
    is the only device-to-host transfer of a logged step, and steps that do not log make none.
    """

    def __init__(self, rank, start_step, end_step, global_batch, log_every):
        self.rank, self.start_step, self.end_step = rank, start_step, end_step
        self.global_batch = global_batch
        # About 200 Loss/Throughput points per run, taken at logged steps.
        self.metrics_every = log_every * max(1, math.ceil((end_step - start_step) / 200 / log_every))
        self.loss_metrics, self.throughput_metrics = [], []
        self.peak_throughput, self.last_loss = 0.0, None
        self.loop_start = self.interval_start = time.perf_counter()
        self.interval_from = start_step
        self.first_step_seconds = None
        self.first_step_at = None  # wall clock, UTC: the pipeline's time to first step ends here

    def step_done(self, step):
        if self.first_step_seconds is None:
            self.first_step_seconds = time.perf_counter() - self.loop_start
            self.first_step_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")

    def report(self, reduced_loss, step, lr):
        self.last_loss = float(reduced_loss.item())
        now = time.perf_counter()
        throughput = self.global_batch * (step - self.interval_from) / (now - self.interval_start)
        steps_timed = step - self.start_step - 1
        # The first step carries warm-up (compilation, allocations); ETA uses the rest.
        per_step = ((now - self.loop_start - self.first_step_seconds) / steps_timed
                    if steps_timed > 0 and self.first_step_seconds is not None
                    else now - self.loop_start)
        eta = per_step * (self.end_step - step)
        is_last = step == self.end_step
        if step - self.start_step > 1 or is_last:
            self.peak_throughput = max(self.peak_throughput, throughput)
        if self.rank == 0:
            print(f"UC_PROGRESS step={step} total={self.end_step} loss={self.last_loss:.6f} "
                  f"lr={lr:.6f} throughput={throughput:.2f} eta_s={int(round(eta))}", flush=True)
            if step % self.metrics_every == 0 or is_last:
                self.loss_metrics.append(metric("Loss", self.last_loss, "", {"step": step}))
                self.throughput_metrics.append(
                    metric("Throughput", throughput, "seq/s", {"step": step}))
        self.interval_start, self.interval_from = now, step


def recorded_env() -> dict:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


def env_json(name, default=None):
    return json.loads(os.environ.get(name) or "null") or default


def node_health():
    """The node health gate's report, for results.json: the instance type and each node's checks
    (its ``UC_HEALTH`` lines, from the file the job names in NODE_HEALTH_REPORT once the gate
    passed), or None when the job ran no gate. ValueError when the named report is unreadable."""
    path = os.environ.get("NODE_HEALTH_REPORT")
    if not path:
        return None
    try:
        lines = [line for line in Path(path).read_text().splitlines() if HEALTH_PREFIX in line]
        nodes = [json.loads(line[line.find(HEALTH_PREFIX) + len(HEALTH_PREFIX):]) for line in lines]
    except (OSError, ValueError) as err:
        raise ValueError(f"NODE_HEALTH_REPORT {path} is unreadable: {err}") from None
    if not nodes:
        raise ValueError(f"NODE_HEALTH_REPORT {path} holds no {HEALTH_PREFIX.strip()} line")
    return {"instance_type": nodes[0].get("instance_type"), "nodes": nodes}
