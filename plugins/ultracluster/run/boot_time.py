"""How long a compute node takes to boot, against ParallelCluster's compute-node bootstrap timeout: an
estimate from the checked-in table ``include/cluster/boot-steps.json`` (docs/operations.md, "Node
boot time").

A node booting ParallelCluster's own image installs the Neuron stack (the driver's DKMS build, the
runtime, a torch / torch-xla / neuronx-cc venv) before it may join Slurm, where the profile opts in to
that (install_neuron_at_boot); the node image trn1_build_image builds (run.node_image) skips it. The nodes of a job boot at once and share one NAT gateway: each downloads at
``min(node rate, NAT rate / nodes at once)``. A node's boot is its steps' seconds plus its downloads at
that rate; the job waits for one boot, not their sum. Every figure in the table has a source or says
it is an assumption (``load_boot_steps`` refuses a row without either).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ultracluster.run.profiles import include_dir

BOOT_STEPS_ENV_VAR = "ULTRACLUSTER_BOOT_STEPS_FILE"
INSTALL_AT_BOOT, PREBUILT_IMAGE = "install_at_boot", "prebuilt_image"


class BootTableError(ValueError):
    """The boot-steps table is missing, malformed, or has a figure without a source."""


def boot_steps_path(path: str | os.PathLike | None = None) -> Path:
    """``path``, else ``$ULTRACLUSTER_BOOT_STEPS_FILE``, else include/cluster/boot-steps.json."""
    return Path(path or os.environ.get(BOOT_STEPS_ENV_VAR) or include_dir() / "cluster" / "boot-steps.json")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise BootTableError(f"{where} must be a number >= 0, got {value!r}")
    return float(value)


def _provenance(entry: dict[str, Any], where: str) -> None:
    """A figure states its source, or is an assumption with its reasoning: one or the other."""
    sourced = isinstance(entry.get("source"), str) and entry["source"].strip()
    assumed = entry.get("assumption") is True and isinstance(entry.get("reasoning"), str) and entry["reasoning"].strip()
    if bool(sourced) == bool(assumed):
        raise BootTableError(f"{where} needs a 'source', or 'assumption': true with its 'reasoning' (one of them)")


def _check_step(step: Any, phases: set[str], seen: set[str], where: str) -> None:
    if not isinstance(step, dict) or not isinstance(step.get("id"), str):
        raise BootTableError(f"{where} must be an object with an 'id'")
    where = f"{where} ({step['id']})"
    if step["id"] in seen:
        raise BootTableError(f"{where}: the id is used twice")
    seen.add(step["id"])
    if step.get("phase") not in phases:
        raise BootTableError(f"{where}: phase {step.get('phase')!r} is in no row set ({', '.join(sorted(phases))})")
    figures = [k for k in ("seconds", "download_mb") if k in step]
    if len(figures) != 1:
        raise BootTableError(f"{where} needs exactly one of 'seconds' or 'download_mb'")
    _number(step[figures[0]], f"{where} {figures[0]}")
    for itype, seconds in (step.get("seconds_by_instance_type") or {}).items():
        _number(seconds, f"{where} seconds_by_instance_type.{itype}")
    _provenance(step, where)


def load_boot_steps(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The table (see ``boot_steps_path``), checked: every row one figure with its provenance."""
    where = boot_steps_path(path)
    try:
        table = json.loads(where.read_text())
    except (OSError, ValueError) as err:
        raise BootTableError(f"Cannot read the boot-steps table {where} (override: {BOOT_STEPS_ENV_VAR}): {err}") from err
    try:
        _provenance(table["bootstrap_timeout"], "bootstrap_timeout")
        _number(table["bootstrap_timeout"]["seconds"], "bootstrap_timeout.seconds")
        _provenance(table["warn_at_share"], "warn_at_share")
        _number(table["warn_at_share"]["value"], "warn_at_share.value")
        for name in ("node_download_mb_per_s", "nat_gateway_mb_per_s"):
            _provenance(table["network"][name], f"network.{name}")
            if not _number(table["network"][name]["value"], f"network.{name}.value"):
                raise BootTableError(f"network.{name}.value must be > 0")
        row_sets = table["row_sets"]
        if set(row_sets) != {INSTALL_AT_BOOT, PREBUILT_IMAGE}:
            raise BootTableError(f"row_sets must be {INSTALL_AT_BOOT} and {PREBUILT_IMAGE}, got {sorted(row_sets)}")
        phases = {phase for names in row_sets.values() for phase in names}
        seen: set[str] = set()
        for i, step in enumerate(table["steps"]):
            _check_step(step, phases, seen, f"steps[{i}]")
    except (KeyError, TypeError, AttributeError) as err:
        raise BootTableError(f"Boot-steps table {where}: missing or malformed {err}") from err
    table["file"] = str(where)
    return table


def nodes_at_once(num_nodes: int, min_nodes: int = 0) -> int:
    """Nodes that boot together: static ones (min_nodes) at creation, the job's dynamic rest together
    when it is submitted."""
    static = max(0, min(int(min_nodes or 0), int(num_nodes)))
    return max(1, static, int(num_nodes) - static)


def estimate(table: dict[str, Any], *, instance_type: str, nodes: int, prebuilt: bool) -> dict[str, Any]:
    """One node's boot while ``nodes`` boot at once: ``{"seconds", "timeout_s", "share", "row_set",
    "nodes", "download_mb", "mb_per_s", "nat_limited", "steps": [{"id", "seconds"}]}``."""
    row_set = PREBUILT_IMAGE if prebuilt else INSTALL_AT_BOOT
    phases = set(table["row_sets"][row_set])
    node_rate = float(table["network"]["node_download_mb_per_s"]["value"])
    nat_share = float(table["network"]["nat_gateway_mb_per_s"]["value"]) / max(1, int(nodes))
    rate = min(node_rate, nat_share)
    steps, download_mb = [], 0.0
    for step in table["steps"]:
        if step["phase"] not in phases:
            continue
        if "download_mb" in step:
            download_mb += float(step["download_mb"])
            seconds = float(step["download_mb"]) / rate
        else:
            seconds = float((step.get("seconds_by_instance_type") or {}).get(instance_type, step["seconds"]))
        steps.append({"id": step["id"], "seconds": round(seconds, 1)})
    total = sum(s["seconds"] for s in steps)
    timeout = float(table["bootstrap_timeout"]["seconds"])
    return {"seconds": round(total), "timeout_s": round(timeout), "share": round(total / timeout, 4),
            "row_set": row_set, "nodes": int(nodes), "instance_type": instance_type,
            "download_mb": round(download_mb, 1), "mb_per_s": round(rate, 1),
            "nat_limited": download_mb > 0 and nat_share < node_rate,
            "steps": steps}


def describe(boot: dict[str, Any]) -> str:
    """One line: the estimate, the timeout and the share."""
    image = "a prebuilt image" if boot["row_set"] == PREBUILT_IMAGE else "the Neuron stack installed at boot"
    network = (f"; {boot['download_mb']:.0f} MB each at {boot['mb_per_s']:.1f} MB/s"
               f"{' (the NAT gateway shared by ' + str(boot['nodes']) + ' nodes)' if boot['nat_limited'] else ''}"
               if boot["download_mb"] else "")
    return (f"node boot estimate: {boot['seconds']} s for {boot['nodes']} × {boot['instance_type']} booting at once "
            f"with {image}{network}: {boot['share']:.1%} of the {boot['timeout_s']} s compute-node bootstrap timeout")


def boot_warning(boot: dict[str, Any], warn_at_share: float) -> str | None:
    """The preflight warning at ``warn_at_share`` of the timeout or more (None below it)."""
    if boot["seconds"] < warn_at_share * boot["timeout_s"]:
        return None
    fix = ("" if boot["row_set"] == PREBUILT_IMAGE else
           "; the node image skips the install (trigger trn1_build_image; docs/operations.md, \"The node image\")")
    return (f"num_nodes: {describe(boot)}, at or over the {warn_at_share:.0%} warning line: nodes past the "
            f"timeout are replaced, and the fleet wait may fail{fix}")
