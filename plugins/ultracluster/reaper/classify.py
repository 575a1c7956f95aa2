"""Which of the pipeline's resources are orphans: the reaper's rules, in one place.

A resource is reaped only when it carries the created-by marker and either its run has ended, or
its expiry has passed and its run cannot be found. Anything else is kept, with the reason why. A
sweep's shared cluster is its holder run's (``run.shared_cluster``): kept while that run is live,
whichever of the sweep's points have ended.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ultracluster.run.shared_cluster import HOLDER_DAG_ID
from ultracluster.run.states import RUN_ENDED
from ultracluster.run.tags import CREATED_BY, CREATED_BY_TAG, DAG_ID_TAG, EXPIRES_AT_TAG, RUN_ID_TAG, parse_expiry

# (dag_id, run_id) -> the DAG run's state ("queued", "running", "success", "failed"), None when
# there is no such run. Errors propagate: a run must not look gone because the API was unreachable.
RunState = Callable[[str, str], "str | None"]

CLUSTER, STACK, SCRATCH = "cluster", "stack", "scratch"


@dataclass(frozen=True)
class Verdict:
    """One resource's verdict: ``reap`` True with the reason it is an orphan, or why it is kept."""

    kind: str
    name: str
    dag_id: str | None
    run_id: str | None
    reap: bool
    reason: str

    def line(self) -> str:
        owner = f"{self.dag_id}/{self.run_id}" if self.run_id else "(no run id)"
        return f"{self.kind} {self.name}  run {owner}  {self.reason}"


def judge(kind: str, name: str, tags: dict[str, str], run_state: RunState, now: datetime) -> Verdict:
    """The verdict on one resource from its tags, its run's state and the time."""
    dag_id, run_id = tags.get(DAG_ID_TAG) or None, tags.get(RUN_ID_TAG) or None

    def verdict(reap: bool, reason: str) -> Verdict:
        return Verdict(kind, name, dag_id, run_id, reap, reason)

    if tags.get(CREATED_BY_TAG) != CREATED_BY:
        return verdict(False, f"kept: no {CREATED_BY_TAG}={CREATED_BY} marker")
    state = None
    if dag_id and run_id:
        raw = run_state(dag_id, run_id)
        state = str(getattr(raw, "value", raw)).lower() if raw is not None else None
    if state in RUN_ENDED:
        return verdict(True, f"run ended ({state})")
    if state is not None:  # queued, running, or a state this code does not know: live
        if dag_id == HOLDER_DAG_ID:
            return verdict(False, f"kept: a sweep's shared cluster (or its network), its holder run is {state}")
        return verdict(False, f"kept: run is {state}")
    expiry = parse_expiry(tags.get(EXPIRES_AT_TAG))
    if expiry is None:
        return verdict(False, f"kept: run unknown and no valid {EXPIRES_AT_TAG}")
    stamp = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
    if expiry > now:
        return verdict(False, f"kept: run unknown, expires {stamp}")
    return verdict(True, f"expired {stamp} and run unknown")
