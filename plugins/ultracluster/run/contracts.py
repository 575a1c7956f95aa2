"""The training job's contracts with the pipeline: where its files are, what its checkpoints are
called, and what its results.json says (include/training writes them; docs/contracts.md).
"""
from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

RESULTS_FILE = "results.json"
USAGE_FILE = "usage.json"  # delete_cluster's bill, written beside the results
# The program's checkpoint names (include/training: CHECKPOINT_PATTERN); ``.ckpt_<step>.pt.tmp``
# files being written never match.
CHECKPOINT_NAME = re.compile(r"^ckpt_(\d+)\.pt$")
CHECKPOINT_KEY = re.compile(r"(?:^|/)ckpt_(\d+)\.pt$")
# The job directory's own files: Slurm's log (.out) and the job's markers (exit, name, launch).
_SLURM_FILE = re.compile(r"^slurm-\d+\.[A-Za-z]+$")


def output_dir(output_root: str, job_id: str) -> str:
    """Where a job writes its checkpoints, logs and results.json."""
    return posixpath.join(output_root, f"output_{job_id}")


def newest_checkpoint(listing: str) -> int | None:
    """Step of the newest complete checkpoint in a listing of a ``checkpoints/`` directory (one
    ``[<size> ]<name>`` a line, as ``remote_commands.list_files`` prints)."""
    steps = [int(m.group(1)) for line in listing.splitlines()
             if (m := CHECKPOINT_NAME.match(line.strip().split(" ", 1)[-1]))]
    return max(steps, default=None)


_NODE_LOG = re.compile(r"(^|/)log_[^/]*$")
_CHECKPOINT = re.compile(r"(ckpt|checkpoint)|\.(pt|pth|bin|safetensors)$", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


def _metric_values(metrics: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    values = []
    for metric in metrics:
        if str(metric.get("MetricName", "")).strip().lower() == name.lower():
            try:
                values.append(float(metric["MeasuredValue"]))
            except (KeyError, TypeError, ValueError):
                continue
    return values


def _param(parameters: Mapping[str, Any], *names: str) -> Any:
    lowered = {str(k).strip().lower(): v for k, v in parameters.items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def model_name(parameters: Mapping[str, Any]) -> str | None:
    """The model a run trained, as results.json's "Model" names it without its details:
    ``BERT-tiny (BertForPreTraining, MLM+NSP)`` -> ``BERT-tiny``."""
    model = str(_param(parameters, "Model") or "").split(" (", 1)[0].strip()
    return model or None


def device_of(parameters: Mapping[str, Any]) -> str | None:
    """What trained: results.json's "Device" (``cpu``, ``cuda``, ``xla``); for XLA with the PJRT
    device torch-xla ran on (its ``PJRT_DEVICE``, recorded with the environment), as ``xla:NEURON``
    on Trainium or ``xla:CPU`` on torch-xla's CPU runtime."""
    kind = str(_param(parameters, "Device") or "").strip().lower()
    if kind != "xla":
        return kind or None
    env = _param(parameters, "Environment variables")
    pjrt = str((env if isinstance(env, Mapping) else {}).get("PJRT_DEVICE") or "")
    return f"xla:{pjrt.split('_')[0].upper()}" if pjrt else "xla"


def _int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def extract_metrics(
    results: Mapping[str, Any], *, num_nodes: int | None = None, scaling_mode: str | None = None
) -> dict[str, Any]:
    """Key metrics from a blog-era results.json:
    ``{"results": {"parameters": {...}, "metrics": [{"MetricName", "MeasuredValue", "Units", ...}]}}``.

    Final values win over running ones: "Final loss" else the last "Loss"; "Average throughput"
    else the mean of "Throughput"; "Peak throughput" else their maximum.
    """
    body = results.get("results")
    if not isinstance(body, Mapping) or not isinstance(body.get("metrics"), list):
        raise ValueError("results.json has no results.metrics list (blog-era schema expected)")
    parameters = body.get("parameters") or {}
    metrics = body["metrics"]
    losses = _metric_values(metrics, "Loss")
    throughputs = _metric_values(metrics, "Throughput")
    final_loss = (_metric_values(metrics, "Final loss") or losses[-1:] or [None])[-1]
    average = (_metric_values(metrics, "Average throughput") or [None])[-1]
    if average is None and throughputs:
        average = sum(throughputs) / len(throughputs)
    peak = (_metric_values(metrics, "Peak throughput") or [None])[-1]
    if peak is None and throughputs:
        peak = max(throughputs)
    time_to_train = (_metric_values(metrics, "Time to train") or [None])[-1]

    world_size = _int(_param(parameters, "World size"))
    batch = _int(_param(parameters, "Batch size"))
    accumulation = _int(_param(parameters, "Gradient accumulation microsteps"))
    global_batch = _int(_param(parameters, "Global batch size", "Global batch"))
    if global_batch is None and None not in (world_size, batch, accumulation):
        global_batch = world_size * batch * accumulation
    nodes = num_nodes or _int(_param(parameters, "Nodes", "Number of nodes", "Num nodes"))
    mode = scaling_mode or _param(parameters, "Scaling mode", "Scaling")
    total_steps = _int(_param(parameters, "Total steps"))
    start, end = _int(_param(parameters, "Start step")), _int(_param(parameters, "End step"))
    steps = end - start if None not in (start, end) else None
    # A bounded run (a sweep point: steps_this_run < max_steps) measures throughput; the full run's
    # time to train is then extrapolated from it, and marked so.
    extrapolated = bool(steps and total_steps and (start or end < total_steps))
    if extrapolated and average and global_batch:
        time_to_train = total_steps * global_batch / average / 60.0
    return {
        "final_loss": final_loss,
        "average_throughput_seq_per_s": average,
        "peak_throughput_seq_per_s": peak,
        "time_to_train_min": time_to_train,
        "nodes": nodes,
        "world_size": world_size,
        "global_batch": global_batch,
        "scaling_mode": mode,
        "total_steps": total_steps,
        "steps": steps,
        "time_to_train_extrapolated": extrapolated,
        "sweep": parameters.get("Sweep"),
        "model": model_name(parameters),
        "device": device_of(parameters),
    }


def select_artifacts(files: Mapping[str, int], results_name: str = "results.json") -> list[str]:
    """results.json, every per-node log, and the final checkpoint (highest step number, else all).

    Hidden files (``.ckpt_40.pt.tmp``: a checkpoint being written) are never picked.
    """
    files = {p: size for p, size in files.items() if not posixpath.basename(p).startswith(".")}
    chosen = [p for p in files if posixpath.basename(p) == results_name]
    chosen += [p for p in files if _NODE_LOG.search(p)]
    taken = set(chosen)  # a set: a list lookup per file made this quadratic in the node count
    checkpoints = [p for p in files if _CHECKPOINT.search(p) and p not in taken]

    def step(path: str) -> int:
        numbers = _NUMBER.findall(path)
        return int(numbers[-1]) if numbers else -1

    if checkpoints:
        # A checkpoint may span several files (shards): keep every file of the newest one.
        newest = max(step(p) for p in checkpoints)
        chosen += [p for p in checkpoints if step(p) == newest]
    return sorted(dict.fromkeys(chosen))


def select_failure_artifacts(files: Mapping[str, int]) -> list[str]:
    """Paths relative to the job directory: every Slurm job file at its top, and in each job's
    output directory what collect_results would take (results.json, node logs, newest checkpoint)."""
    chosen: list[str] = []
    outputs: dict[str, dict[str, int]] = {}
    for path, size in files.items():
        top, _, rest = path.partition("/")
        if not rest:
            if _SLURM_FILE.match(top):
                chosen.append(path)
        elif not top.startswith("."):
            outputs.setdefault(top, {})[rest] = size
    for top, inside in outputs.items():
        chosen += [f"{top}/{rel}" for rel in select_artifacts(inside)]
    return sorted(chosen)


def compile_cache_figures(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """A compile job's cache hits and misses from its results.json (None when it has no metrics)."""
    try:
        metrics = results["results"]["metrics"]
    except (KeyError, TypeError):
        return None
    stats = {m["MetricName"]: m for m in metrics if str(m.get("MetricName", "")).startswith("Compile cache")}
    hits, misses = stats.get("Compile cache hits", {}), stats.get("Compile cache misses", {})
    return {"backend": (hits.get("AdditionalData") or {}).get("backend"),
            "hits": hits.get("MeasuredValue"), "misses": misses.get("MeasuredValue")}
