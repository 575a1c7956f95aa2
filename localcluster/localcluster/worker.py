"""Detached background work behind the asynchronous pcluster commands.

    python -m localcluster.worker create <cluster_dir>
    python -m localcluster.worker delete <cluster_dir>
    python -m localcluster.worker fleet  <cluster_dir> START_REQUESTED|STOP_REQUESTED <request id>

create and delete coordinate through cluster.json: delete-cluster sets deleteRequested, the create
worker checks it between steps and stops; the delete worker waits for the create worker to exit
before tearing down.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from . import bootstrap, state
from .aws import Aws
from .runtime.procs import pid_alive
from .shapes import iso_now
from .spec import ClusterSpec

LOG = logging.getLogger("localcluster.worker")
POLL_S = 0.2
CREATE_WORKER_EXIT_TIMEOUT_S = 120.0


def spawn(command: str, cluster_dir: Path, *args: str, log_file: Path | None = None) -> int:
    """Start a worker in its own session so it outlives the CLI call; returns its pid."""
    log_path = log_file or cluster_dir / f"worker-{command}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "localcluster.worker", command, str(cluster_dir), *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
        )
    return process.pid


def worker_alive(pid: int | None) -> bool:
    """pid is still one of our workers (not a dead one, nor a recycled pid of another program)."""
    if not pid_alive(pid):
        return False
    try:
        return b"localcluster.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _names(cluster_dir: Path) -> tuple[str, Path]:
    return cluster_dir.name, cluster_dir.parent.parent


def _delete_requested(name: str, home: Path) -> bool:
    try:
        return bool(state.read_state(name, home).get("deleteRequested"))
    except state.ClusterNotFound:
        return True


def _rollback(name: str, home: Path) -> bool:
    try:
        return bool(state.read_state(name, home).get("rollbackOnFailure", True))
    except state.ClusterNotFound:
        return True


def _mark_failed(name: str, home: Path, code: str) -> bool:
    """CREATE_FAILED with failure code; False when a delete took over meanwhile."""
    try:
        with state.update_state(name, home) as current:
            if current.get("deleteRequested"):
                return False
            rollback = current.get("rollbackOnFailure", True)
            current["cloudFormationStackStatus"] = "ROLLBACK_COMPLETE" if rollback else "CREATE_FAILED"
            current["failureCode"] = code
            current["lastUpdatedTime"] = iso_now()
    except state.ClusterNotFound:
        return False
    return True


def create(cluster_dir: Path) -> int:
    name, home = _names(cluster_dir)
    spec = ClusterSpec.from_dict(json.loads((cluster_dir / "spec.json").read_text()))
    deadline = time.monotonic() + spec.faults.provisioning_delay
    while time.monotonic() < deadline:
        if _delete_requested(name, home):
            LOG.info("delete requested during provisioning delay; stopping")
            return 0
        time.sleep(POLL_S)
    if spec.faults.fail_create:
        LOG.info("fault injection: fail-create %s", spec.faults.fail_create)
        bootstrap.failed(cluster_dir, spec, spec.faults.fail_create, _rollback(name, home))
        _mark_failed(name, home, spec.faults.fail_create)
        return 0
    if _delete_requested(name, home):
        return 0
    try:
        from .runtime import provision
        provision(spec, cluster_dir)
    except Exception:
        LOG.error("provision failed:\n%s", traceback.format_exc())
        bootstrap.failed(cluster_dir, spec, "HeadNodeBootstrapFailure", _rollback(name, home), traceback.format_exc())
        _mark_failed(name, home, "HeadNodeBootstrapFailure")
        return 1
    try:
        bootstrap.completed(cluster_dir, spec)
    except Exception:   # the records explain a status; they never change it
        LOG.error("could not record the bootstrap:\n%s", traceback.format_exc())
    try:
        with state.update_state(name, home) as current:
            if current.get("deleteRequested"):
                return 0   # the delete worker tears the fresh daemons down
            now = iso_now()
            current.update(cloudFormationStackStatus="CREATE_COMPLETE", lastUpdatedTime=now,
                           computeFleetStatus="RUNNING", lastStatusUpdatedTime=now)
    except state.ClusterNotFound:
        return 0
    LOG.info("cluster %s CREATE_COMPLETE", name)
    return 0


def _wait_for_create_worker(pid: int | None) -> None:
    deadline = time.monotonic() + CREATE_WORKER_EXIT_TIMEOUT_S
    while worker_alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if pid and worker_alive(pid):
        LOG.warning("create worker %s still running after %ss; killing its process group", pid,
                    CREATE_WORKER_EXIT_TIMEOUT_S)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _teardown_runtime(cluster_dir: Path) -> None:
    try:
        from .runtime import teardown
    except ImportError:
        if (cluster_dir / "runtime.json").exists():
            raise
        return   # nothing was provisioned, and nothing can be: no daemons to stop
    teardown(cluster_dir)


def delete(cluster_dir: Path) -> int:
    name, home = _names(cluster_dir)
    current = state.read_state(name, home)
    _wait_for_create_worker(current.get("createWorkerPid"))
    saved = state.read_state(name, home)
    with state.cluster_lock(name, home):
        try:
            _teardown_runtime(cluster_dir)
        except Exception:
            LOG.error("teardown failed:\n%s", traceback.format_exc())
            _rewrite_state(cluster_dir, saved, "DELETE_FAILED")
            return 1
        # teardown removed the directory; the cluster stays visible until its stack is gone too.
        _rewrite_state(cluster_dir, saved, "DELETE_IN_PROGRESS")
    aws = Aws(saved["region"])
    try:
        # As the cluster stack's delete does: the head node and any compute node still up.
        aws.terminate_instances(aws.live_cluster_instances(name))
        aws.delete_stack(name)
        if saved.get("configBucket"):
            aws.delete_config(saved["configBucket"], saved["configKey"])
    except Exception:
        # The daemons are gone; an unreachable moto must not keep the cluster alive.
        LOG.error("AWS clean-up failed (stack or config left in moto):\n%s", traceback.format_exc())
    with state.cluster_lock(name, home):
        shutil.rmtree(cluster_dir, ignore_errors=True)
    state.record("deleted", name, dict(saved.get("stackTags") or []), home)
    LOG.info("cluster %s deleted", name)
    return 0


def _rewrite_state(cluster_dir: Path, saved: dict, stack_status: str) -> None:
    """Caller holds the cluster lock."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    saved = dict(saved, cloudFormationStackStatus=stack_status, lastUpdatedTime=iso_now())
    if stack_status == "DELETE_FAILED":
        saved["deleteRequested"] = False
    state.write_json_atomic(cluster_dir / "cluster.json", saved)


def fleet(cluster_dir: Path, requested: str, request_id: int) -> int:
    name, home = _names(cluster_dir)
    from .runtime import set_compute_fleet
    try:
        # One fleet change at a time per cluster: a START sent during a STOP waits for it.
        with state.cluster_lock(f"{name}.fleet", home):
            final = set_compute_fleet(cluster_dir, requested)
    except Exception:
        LOG.error("set_compute_fleet failed:\n%s", traceback.format_exc())
        final = "UNKNOWN"
    try:
        with state.update_state(name, home) as current:
            if current.get("fleetRequestId", 0) == request_id:   # else a newer request is still pending
                current.update(computeFleetStatus=final, fleetRequestPending=False,
                               lastStatusUpdatedTime=iso_now())
    except state.ClusterNotFound:
        return 0   # deleted meanwhile
    return 0 if final != "UNKNOWN" else 1


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = argv if argv is not None else sys.argv[1:]
    command, cluster_dir = args[0], Path(args[1])
    LOG.info("worker %s %s (pid %s)", command, cluster_dir, os.getpid())
    if command == "create":
        return create(cluster_dir)
    if command == "delete":
        return delete(cluster_dir)
    if command == "fleet":
        return fleet(cluster_dir, args[2], int(args[3]))
    raise SystemExit(f"unknown worker command {command!r}")


if __name__ == "__main__":
    sys.exit(main())
