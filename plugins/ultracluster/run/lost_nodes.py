"""The lost-node rule: a node that fails (its bootstrap times out, its power-up fails, or it fails
the health gate) is replaced up to ``node_replacements`` times; one more loss fails the run, naming
the node and why. ParallelCluster replaces the node (clustermgtd); the rule only counts and decides.

One ledger per task, as plain data: a trigger carries it in its arguments and returns it in its
event, the task keeps it in its state store, so retries and resumes go on counting. A loss is one
episode: the node is lost when first seen failing (the fleet wait) or when a job ends with it failed
(a node fault, a health gate drain), and can be lost again only once it came back healthy.

A launch EC2 refused for want of capacity (insufficient capacity, ICE) is a loss like any other:
ParallelCluster holds the node down for its insufficient_capacity_timeout, then launches it again
(docs/operations.md, "Capacity faults").
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# One replacement per node: a single bad instance (a bootstrap flake, a faulty device) is common
# and costs one more boot to replace; the same node failing twice points at something systematic
# (the image, the set-up script, the capacity pool), where each further try bills another boot.
# 0 restores fail-at-once.
DEFAULT_NODE_REPLACEMENTS = 1
MAX_NODE_REPLACEMENTS = 5
# The EC2 error codes ParallelCluster treats as insufficient capacity (aws-parallelcluster-node,
# slurm_resources.py: SlurmNode.EC2_ICE_ERROR_CODES), as its resume writes them in a node's reason:
# "(Code:InsufficientInstanceCapacity)Failure when resuming nodes".
CAPACITY_ERROR_CODES = frozenset({"InsufficientInstanceCapacity", "InsufficientHostCapacity",
                                  "InsufficientReservedInstanceCapacity", "MaxSpotInstanceCountExceeded",
                                  "Unsupported", "SpotMaxPriceTooLow"})
_ERROR_CODE = re.compile(r"\(Code:(\w+)\)")
CAPACITY_ADVICE = ("try another Availability Zone (availability_zone_id), an On-Demand Capacity Reservation "
                   "(capacity_reservation_id) or a Capacity Block (capacity_type CAPACITY_BLOCK)")


def replacements(value: Any) -> int:
    """``node_replacements`` checked: an int from 0 to MAX_NODE_REPLACEMENTS."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"node_replacements must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not 0 <= number <= MAX_NODE_REPLACEMENTS or str(number) != str(value).strip():
        raise ValueError(f"node_replacements must be 0 to {MAX_NODE_REPLACEMENTS}, got {value!r}")
    return number


def capacity_error(reason: str | None) -> str | None:
    """The insufficient-capacity code a node's reason names ("(Code:<code>)..."), else None."""
    match = _ERROR_CODE.search(reason or "")
    return match.group(1) if match and match.group(1) in CAPACITY_ERROR_CODES else None


def capacity_denied(failed: Mapping[str, str]) -> str | None:
    """The capacity error when every one of ``failed`` (node -> reason) was refused for want of
    capacity, its launch never done (a job on them never started); else None."""
    codes = {capacity_error(reason) for reason in failed.values()}
    return ", ".join(sorted(codes)) if failed and None not in codes else None


@dataclass
class LostNodes:
    """Losses per node; ``limit`` = node_replacements."""

    limit: int = DEFAULT_NODE_REPLACEMENTS
    counts: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # the last loss's reason
    failing: list[str] = field(default_factory=list)  # lost, not seen healthy since
    jobs: list[str] = field(default_factory=list)  # jobs whose failed nodes are counted

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, limit: int) -> LostNodes:
        """The stored ledger (None or a malformed one: an empty ledger), under this task's ``limit``."""
        data = data if isinstance(data, Mapping) else {}
        try:
            return cls(limit=limit, counts={str(k): int(v) for k, v in dict(data.get("counts") or {}).items()},
                       reasons={str(k): str(v) for k, v in dict(data.get("reasons") or {}).items()},
                       failing=[str(n) for n in data.get("failing") or []],
                       jobs=[str(j) for j in data.get("jobs") or []])
        except (TypeError, ValueError):
            return cls(limit=limit)

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "reasons": dict(self.reasons), "failing": list(self.failing),
                "jobs": list(self.jobs)}

    def lose(self, node: str, reason: str) -> bool:
        """Count a loss of ``node`` unless its current episode is counted already."""
        if node in self.failing:
            return False
        self.failing.append(node)
        self.counts[node] = self.counts.get(node, 0) + 1
        self.reasons[node] = reason
        return True

    def fault(self, job_id: str, nodes: Mapping[str, str]) -> list[str]:
        """The nodes a job lost (node -> reason), counted once per job: the nodes newly lost."""
        if str(job_id) in self.jobs:
            return []
        self.jobs.append(str(job_id))
        return [node for node, reason in sorted(nodes.items()) if self.lose(node, reason)]

    def observe(self, failed: Mapping[str, str], healthy: Iterable[str]) -> list[str]:
        """One look at the partition: ``failed`` nodes (node -> reason) are lost, nodes seen
        ``healthy`` end their episode. Returns the nodes newly lost."""
        healthy = set(healthy)
        self.failing = [node for node in self.failing if node not in healthy]
        return [node for node, reason in sorted(failed.items()) if self.lose(node, reason)]

    @property
    def past(self) -> list[str]:
        """Nodes lost more often than they may be replaced."""
        return sorted(node for node, count in self.counts.items() if count > self.limit)

    def replacing(self, nodes: Iterable[str]) -> list[str]:
        """Of ``nodes`` (failed now), those still within their replacements."""
        return sorted(node for node in nodes if self.counts.get(node, 0) <= self.limit)

    def failure(self) -> str:
        """The message of a run that lost nodes past the limit."""
        named = "; ".join(f"{node} ({self.reasons.get(node, 'no reason given')}) lost {self.counts[node]} time(s)"
                          for node in self.past)
        codes = sorted({code for node in self.past if (code := capacity_error(self.reasons.get(node)))})
        again = ", again after ParallelCluster's insufficient-capacity hold" if self.limit else ""
        capacity = f". EC2 had no capacity ({', '.join(codes)}){again}; {CAPACITY_ADVICE}" if codes else ""
        return f"Nodes lost past node_replacements={self.limit}: {named}{capacity}"

    def describe(self) -> str:
        return ", ".join(f"{node} {count}/{self.limit + 1}" for node, count in sorted(self.counts.items()))
