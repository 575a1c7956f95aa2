"""The node health gate: what a healthy Trn1 node has, the gate's report lines and each node's verdict.

ParallelCluster runs no Trainium health check before a job. The train job's first step runs
``include/training/node_health.sh`` once on every allocated node; it counts the node's Neuron devices
(``neuron-ls --json-output``) and its EFA devices (the distinct domains of ``fi_info -p efa -t
FI_EP_RDM``) and prints one ``UC_HEALTH <json>`` line. The job's wrap (``remote_commands.sbatch``)
ends the job with ``HEALTH_GATE_EXIT_CODE`` when any node fails, before training starts. The gate's
third check, a short all-reduce across the nodes, is the training program's start-up collective
check (``include/training/pretrain_runtime.py``): it fails with ``UC_ERROR`` naming the ranks, the
backend and the world size, and an all-reduce cannot tell which node broke it, so nothing is drained.

The script compares against the counts it is given (``gate_env``); the verdicts here are judged
again from what it found, so the task decides from the numbers, not from the script's word.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The job's exit code when the gate failed (EX_TEMPFAIL: this node, not the input, is at fault).
# The wrap exits with it; run.jobs.job_outcome reads it as UNHEALTHY.
HEALTH_GATE_EXIT_CODE = 75
GATE_SCRIPT = "node_health.sh"
REPORT_PREFIX = "UC_HEALTH "
# The job's allocated nodes, written by the wrap before the gate runs: a node with no line is named.
NODES_PREFIX = "UC_HEALTH_NODES "
NEURON, EFA = "neuron", "efa"
CHECKS = (NEURON, EFA)
DRAIN_REASON_PREFIX = "UC health check failed: "
_MAX_REASON = 200  # Slurm keeps the whole reason; sinfo and the task log need it short


@dataclass(frozen=True)
class Expected:
    """Devices a healthy node of one instance type has."""

    neuron_devices: int
    efa_devices: int

    def count(self, check: str) -> int:
        return {NEURON: self.neuron_devices, EFA: self.efa_devices}[check]


# Neuron docs: Trn1/Trn1n architecture (16 Trainium devices on the 32xlarge sizes, 1 on trn1.2xlarge)
# and "How to prepare trn1.32xlarge for multi-node execution" (8 EFA devices; trn1n.32xlarge 16; none
# on the smaller sizes).
EXPECTATIONS: dict[str, Expected] = {
    "trn1.32xlarge": Expected(neuron_devices=16, efa_devices=8),
    "trn1n.32xlarge": Expected(neuron_devices=16, efa_devices=16),
    "trn1.2xlarge": Expected(neuron_devices=1, efa_devices=0),
}


def gate_instance_type(value: str | None) -> str | None:
    """The instance type whose expectations a ``health_gate`` setting applies; None: no gate."""
    text = (value or "").strip()
    if text.lower() in ("", "none", "off", "false"):
        return None
    if text not in EXPECTATIONS:
        raise ValueError(f"health_gate: no expectations for instance type {text!r} "
                         f"(known: {', '.join(EXPECTATIONS)}); use None to run without the gate")
    return text


def gate_env(instance_type: str) -> dict[str, str]:
    """The gate script's inputs (include/training/node_health.sh reads them)."""
    expected = EXPECTATIONS[instance_type]
    return {"UC_HEALTH_INSTANCE_TYPE": instance_type, "UC_HEALTH_NEURON_DEVICES": str(expected.neuron_devices),
            "UC_HEALTH_EFA_DEVICES": str(expected.efa_devices)}


# ------------------------------------------------------------------------------------ the report
@dataclass(frozen=True)
class CheckResult:
    """One check on one node: devices found (None: the tool failed, or the check was not run)."""

    found: int | None
    error: str | None = None


@dataclass(frozen=True)
class NodeReport:
    node: str
    checks: dict[str, CheckResult]
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class GateReport:
    """The gate's file: the allocated nodes (None when the wrap wrote none) and each node's line."""

    nodes: list[str] | None
    reports: list[NodeReport]
    unreadable: list[str]  # marker lines that are not the report's JSON


def parse_report(text: str) -> GateReport:
    """The gate's lines in ``text`` (its report file or a job log); other lines are ignored."""
    nodes: list[str] | None = None
    reports: list[NodeReport] = []
    unreadable: list[str] = []
    for line in text.splitlines():
        if (at := line.find(NODES_PREFIX)) >= 0:
            nodes = line[at + len(NODES_PREFIX):].split()
        elif (at := line.find(REPORT_PREFIX)) >= 0:
            try:
                reports.append(_node_report(json.loads(line[at + len(REPORT_PREFIX):])))
            except (ValueError, TypeError, KeyError):
                unreadable.append(line.strip())
    return GateReport(nodes, reports, unreadable)


def _node_report(data: Any) -> NodeReport:
    if not isinstance(data, dict) or not isinstance(data.get("node"), str) or not data["node"]:
        raise ValueError("a report names its node")
    checks = {}
    for name, result in (data.get("checks") or {}).items():
        found = result.get("found")
        if found is not None and (isinstance(found, bool) or not isinstance(found, int)):
            raise ValueError(f"{name}: found is not a count")
        checks[str(name)] = CheckResult(found, str(result["error"]) if result.get("error") else None)
    return NodeReport(data["node"], checks, data)


# ------------------------------------------------------------------------------------ verdicts
@dataclass(frozen=True)
class Verdict:
    """One node: healthy, or the check that failed and why."""

    node: str
    healthy: bool
    check: str | None = None
    why: str | None = None
    found: dict[str, int | None] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """``neuron (found 15 of 16 devices)``, or ``healthy``."""
        return "healthy" if self.healthy else f"{self.check} ({self.why})"

    @property
    def drain_reason(self) -> str:
        """The Slurm drain reason: ``UC health check failed: neuron (found 15 of 16 devices)``."""
        text = " ".join((DRAIN_REASON_PREFIX + self.summary).split())
        return text if len(text) <= _MAX_REASON else text[:_MAX_REASON - 3] + "..."


def judge_node(report: NodeReport, expected: Expected) -> Verdict:
    found = {name: result.found for name, result in report.checks.items()}
    for check in CHECKS:
        want = expected.count(check)
        if want == 0:
            continue  # the instance type has none (trn1.2xlarge's EFA): nothing to check
        result = report.checks.get(check)
        if result is None:
            return Verdict(report.node, False, check, "not reported", found)
        if result.found is None:
            return Verdict(report.node, False, check, result.error or "no count", found)
        if result.found < want:
            return Verdict(report.node, False, check, f"found {result.found} of {want} devices", found)
    return Verdict(report.node, True, found=found)


def judge(gate: GateReport, instance_type: str) -> list[Verdict]:
    """Every node's verdict: each report's, then a silent node's (one the wrap listed but that printed
    nothing). When no node reported at all the gate itself did not run, so no node is blamed."""
    expected = EXPECTATIONS[instance_type]
    verdicts: dict[str, Verdict] = {}
    for report in gate.reports:
        verdicts.setdefault(report.node, judge_node(report, expected))
    if gate.reports:
        for node in gate.nodes or ():
            verdicts.setdefault(node, Verdict(node, False, "report", "the node's gate step printed nothing"))
    return list(verdicts.values())


def losses(verdicts: Iterable[Verdict]) -> dict[str, str]:
    """``{node: drain reason}`` of the unhealthy nodes: what the gate takes out of service."""
    return {v.node: v.drain_reason for v in verdicts if not v.healthy}


def by_reason(lost: Mapping[str, str]) -> dict[str, list[str]]:
    """The lost nodes grouped by drain reason: one ``scontrol update`` per reason."""
    grouped: dict[str, list[str]] = {}
    for node, reason in lost.items():
        grouped.setdefault(reason, []).append(node)
    return grouped


def summary(instance_type: str, verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """What the task returns about the gate (its XCom ``node_health``)."""
    return {"instance_type": instance_type, "healthy": all(v.healthy for v in verdicts) and bool(verdicts),
            "nodes": {v.node: {"verdict": v.summary, "found": dict(v.found)} for v in verdicts}}


def log_lines(instance_type: str, verdicts: Sequence[Verdict]) -> list[str]:
    """The task log's lines: one per node."""
    if not verdicts:
        return [f"Node health gate ({instance_type}): no node reported"]
    bad = sum(not v.healthy for v in verdicts)
    head = (f"Node health gate ({instance_type}): {len(verdicts)} node(s), "
            + (f"{bad} unhealthy" if bad else "all healthy"))
    return [head, *(f"  {v.node}: {v.summary}" + ("" if not v.found else " [" + ", ".join(
        f"{k}={'-' if n is None else n}" for k, n in sorted(v.found.items())) + "]") for v in verdicts)]
