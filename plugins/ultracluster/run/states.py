"""Every state the pipeline waits on, with its one verdict: ready, pending, failed or gone.

Clusters (describe-cluster's clusterStatus), node images (describe-image's imageBuildStatus), stacks
(CloudFormation), compute fleets (computeFleetStatus), Slurm jobs and Airflow runs. Waits, operators
and the reaper judge a state by its verdict here and nowhere else; the pcluster waiter models
(waiters/pcluster.json) are checked against ``pcluster_waiters``.
"""
from __future__ import annotations

READY, PENDING, FAILED, GONE = "ready", "pending", "failed", "gone"
VERDICTS = (READY, PENDING, FAILED, GONE)

# --- clusters: describe-cluster's clusterStatus (a CloudFormation ROLLBACK_* shows as CREATE_FAILED)
CREATE_IN_PROGRESS, CREATE_COMPLETE, CREATE_FAILED = "CREATE_IN_PROGRESS", "CREATE_COMPLETE", "CREATE_FAILED"
UPDATE_IN_PROGRESS, UPDATE_COMPLETE, UPDATE_FAILED = "UPDATE_IN_PROGRESS", "UPDATE_COMPLETE", "UPDATE_FAILED"
DELETE_IN_PROGRESS, DELETE_COMPLETE, DELETE_FAILED = "DELETE_IN_PROGRESS", "DELETE_COMPLETE", "DELETE_FAILED"
CLUSTER_STATES = {
    CREATE_IN_PROGRESS: PENDING,
    CREATE_COMPLETE: READY,
    CREATE_FAILED: FAILED,
    # An update changes a running cluster in place: its head node and Slurm keep serving meanwhile.
    UPDATE_IN_PROGRESS: READY,
    UPDATE_COMPLETE: READY,
    # CloudFormation rolled the update back: the cluster needs a person before anyone relies on it.
    UPDATE_FAILED: FAILED,
    # On its way out: nothing a run waits for comes back from here.
    DELETE_IN_PROGRESS: GONE,
    DELETE_COMPLETE: GONE,
    DELETE_FAILED: FAILED,
}
# What describe-cluster's "does not exist" answer counts as (parsers.pcluster.ClusterNotFoundError).
CLUSTER_NOT_FOUND = GONE


def cluster_verdict(status: str | None) -> str:
    """An unknown or missing status waits: pcluster reports nothing final before it knows."""
    return CLUSTER_STATES.get(str(status or ""), PENDING)


def cluster_waiters(delay: int = 30) -> dict[str, dict]:
    """The pcluster waiters in botocore's model shape, derived from ``CLUSTER_STATES``.

    Create: ready succeeds; failed or gone fails, a vanished cluster too. Delete: only
    DELETE_COMPLETE (or a cluster that no longer exists) succeeds, DELETE_FAILED fails.
    """
    def path(status: str, state: str) -> dict:
        return {"matcher": "path", "argument": "clusterStatus", "expected": status, "state": state}

    create = [path(s, "success") for s, v in CLUSTER_STATES.items() if v == READY]
    create += [path(s, "failure") for s, v in CLUSTER_STATES.items() if v in (FAILED, GONE)]
    create.append({"matcher": "error", "expected": "ClusterNotFoundError", "state": "failure"})
    delete = [path(DELETE_COMPLETE, "success"), path(DELETE_FAILED, "failure"),
              {"matcher": "error", "expected": "ClusterNotFoundError", "state": "success"}]
    return {"ClusterCreateComplete": {"delay": delay, "maxAttempts": 240, "acceptors": create},
            "ClusterDeleteComplete": {"delay": delay, "maxAttempts": 120, "acceptors": delete}}


# --- node images: describe-image's imageBuildStatus (pcluster/api/converters.py maps the build stack's
# status onto it; a built image whose stack cleaned itself up is BUILD_COMPLETE from its AMI)
BUILD_IN_PROGRESS, BUILD_COMPLETE, BUILD_FAILED = "BUILD_IN_PROGRESS", "BUILD_COMPLETE", "BUILD_FAILED"
IMAGE_DELETE_IN_PROGRESS, IMAGE_DELETE_FAILED = "DELETE_IN_PROGRESS", "DELETE_FAILED"
IMAGE_STATES = {
    BUILD_IN_PROGRESS: PENDING, BUILD_COMPLETE: READY, BUILD_FAILED: FAILED,
    IMAGE_DELETE_IN_PROGRESS: GONE, IMAGE_DELETE_FAILED: FAILED, "DELETE_COMPLETE": GONE,
}
# What describe-image's "No image or stack associated" answer counts as (parsers.pcluster.ImageNotFoundError).
IMAGE_NOT_FOUND = GONE


def image_verdict(status: str | None) -> str:
    return IMAGE_STATES.get(str(status or ""), PENDING)


def image_waiters(delay: int = 30) -> dict[str, dict]:
    """Build: ready succeeds, failed or gone fails. Delete: gone (or no longer found) succeeds."""
    def path(status: str, state: str) -> dict:
        return {"matcher": "path", "argument": "imageBuildStatus", "expected": status, "state": state}

    build = [path(s, "success") for s, v in IMAGE_STATES.items() if v == READY]
    build += [path(s, "failure") for s, v in IMAGE_STATES.items() if v in (FAILED, GONE)]
    build.append({"matcher": "error", "expected": "ImageNotFoundError", "state": "failure"})
    delete = [path("DELETE_COMPLETE", "success"), path(IMAGE_DELETE_FAILED, "failure"),
              {"matcher": "error", "expected": "ImageNotFoundError", "state": "success"}]
    # A build takes most of an hour (the Neuron stack, then Image Builder's own steps): 6 h at most.
    return {"ImageBuildComplete": {"delay": delay, "maxAttempts": 720, "acceptors": build},
            "ImageDeleteComplete": {"delay": delay, "maxAttempts": 120, "acceptors": delete}}


def pcluster_waiters(delay: int = 30) -> dict[str, dict]:
    """Every waiter of waiters/pcluster.json."""
    return {**cluster_waiters(delay), **image_waiters(delay)}


# --- CloudFormation stacks (the network stack is created with OnFailure=DO_NOTHING)
STACK_STATES = {
    "CREATE_IN_PROGRESS": PENDING, "CREATE_COMPLETE": READY, "CREATE_FAILED": FAILED,
    "ROLLBACK_IN_PROGRESS": FAILED, "ROLLBACK_COMPLETE": FAILED, "ROLLBACK_FAILED": FAILED,
    "UPDATE_IN_PROGRESS": PENDING, "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS": PENDING, "UPDATE_COMPLETE": READY,
    "UPDATE_ROLLBACK_IN_PROGRESS": PENDING, "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS": PENDING,
    "UPDATE_ROLLBACK_COMPLETE": READY, "UPDATE_ROLLBACK_FAILED": FAILED,
    "DELETE_IN_PROGRESS": GONE, "DELETE_COMPLETE": GONE, "DELETE_FAILED": FAILED,
}


def stack_verdict(status: str | None) -> str:
    """A stack that does not exist (None) is gone."""
    return GONE if status is None else STACK_STATES.get(status, PENDING)


# --- compute fleets: describe-cluster's computeFleetStatus
FLEET_RUNNING = "RUNNING"
FLEET_PROTECTED = "PROTECTED"
FLEET_STATES = {
    FLEET_RUNNING: READY, "START_REQUESTED": PENDING, "STARTING": PENDING, "UNKNOWN": PENDING,
    # ParallelCluster stopped launching nodes after repeated bootstrap failures.
    FLEET_PROTECTED: FAILED,
    "STOP_REQUESTED": FAILED, "STOPPING": FAILED, "STOPPED": FAILED,
}


def fleet_verdict(status: str | None) -> str:
    """Not reported yet (empty) waits."""
    return FLEET_STATES.get(str(status or ""), PENDING)


# --- Slurm jobs: base states (scontrol, squeue and sacct spell them alike)
JOB_PENDING_STATES = frozenset({
    "PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED",
    "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT", "POWER_UP_NODE"})
JOB_RUNNING_STATES = frozenset({"RUNNING", "COMPLETING"})
JOB_SUCCESS_STATES = frozenset({"COMPLETED"})
JOB_FAILURE_STATES = frozenset({
    "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED"})
JOB_TERMINAL_STATES = JOB_SUCCESS_STATES | JOB_FAILURE_STATES
# No source knows the job any more (slurmctld forgot it, no accounting, no exit marker).
JOB_UNKNOWN = "UNKNOWN"
# Node faults, the failures auto-resume answers (docs/operations.md, "Auto-resume"): the job lost a
# node (NODE_FAIL), its nodes never booted (BOOT_FAIL), or it ended otherwise while Slurm gives a
# node going down as the reason (Reason=NodeDown). Anything else, and any UC_ERROR, is the job's own.
NODE_FAULT_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
NODE_FAULT_REASONS = frozenset({"NodeDown"})


def base_state(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``COMPLETING+`` style suffixes dropped."""
    return state.strip().split(" ", 1)[0].rstrip("+").upper()


def job_verdict(state: str | None) -> str:
    base = base_state(state or JOB_UNKNOWN)
    if base in JOB_SUCCESS_STATES:
        return READY
    if base in JOB_FAILURE_STATES:
        return FAILED
    if base == JOB_UNKNOWN:
        return GONE
    return PENDING


def job_is_active(state: str) -> bool:
    """Queued or running: a job worth reattaching to."""
    return base_state(state) in JOB_PENDING_STATES | JOB_RUNNING_STATES


def is_node_fault(state: str | None, reason: str | None = None) -> bool:
    """Did the job end because of a node, not of its own doing?"""
    return base_state(state or "") in NODE_FAULT_STATES or (reason or "").strip() in NODE_FAULT_REASONS


# --- Airflow runs (DagRun states as the report and the reaper name them)
RUN_ENDED = ("success", "failed")
RUN_STATES = ("success", "failed", "running", "queued", "missing")


def run_state_name(state: object) -> str:
    """A DagRun state as a word; no run (None) is "missing"."""
    return str(getattr(state, "value", state) or "missing").lower()
