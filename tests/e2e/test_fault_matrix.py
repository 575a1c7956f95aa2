"""The fault matrix (docs/operations.md, "Faults and what is left"): trn1_bert_pretrain triggered through
the REST API of the shared real Airflow, one fault per run, every selected run at once (1-node clusters
under the deployment's node cap). Faults come from the test deployment's cluster policy
(fault_settings/airflow_local_settings.py, per-run fault files) or from outside: REST PATCHes, SIGKILL,
the head node's sshd stopped, the triggerer killed, the local cluster's own knobs (config tags).
After all runs ended, each case checks its tasks and logs, and nothing may be left: no cluster, stack,
VPC, NAT gateway, EIP, Slurm job, daemon or cluster directory (job directories are on its storage).
"""
from __future__ import annotations

import json
import secrets
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ultracluster.run.names import cluster_name_for, safe_run_id
from ultracluster.run.names import slurm_job_name

from tests.e2e import fault_actions as fa
from tests.e2e.conftest import DAG_ID, RUNTIME_READY, assert_nothing_left, deployment_secrets
from tests.e2e.test_preflight_e2e import task_log
from tests.log_scan import read_logs, scan

# The first case's set-up runs the whole matrix (about 12 minutes alone; longer beside the other
# worker's tests): past pytest.ini's 900 s per test.
pytestmark = [pytest.mark.e2e, pytest.mark.localcluster, pytest.mark.timeout(2400),
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

# One node per run, few steps: the failures come early and the matrix stays short.
SHORT = {"num_nodes": 1, "max_nodes": 1, "max_steps": 10, "steps_this_run": 10}
LONG = {**SHORT, "max_steps": 400, "steps_this_run": 400}  # train still running when the fault comes
OUTAGE_S = 30
UNHEALTHY_NODE = "compute1-dy-trn1-32xl-1"  # the training queue's one dynamic node (SHORT)
TRAINING_RESOURCE = "trn1-32xl"  # its compute resource (a tag value cannot be the knob's `*`)
# The twin's insufficient_capacity_timeout for the capacity case (ParallelCluster's: 600 s): longer than
# the hop from the job's end to the task reading the node's reason, or the reason would be gone. That hop
# includes the triggerer's outage when the kill_triggerer case (OUTAGE_S, plus its restart) overlaps it.
ICE_HOLD_S = 2 * OUTAGE_S
SUITE_TIMEOUT_S = 1500
TEARDOWNS = ("delete_cluster", "delete_vpc")
STEPS = ("preflight", "create_vpc", "render_config", "pcluster_create", "wait_for_fleet", "download_data",
         "restore_compile_cache", "parallel_compile", "train", "collect_results", "save_compile_cache", *TEARDOWNS)


@dataclass
class Case:
    conf: dict
    faults: dict = field(default_factory=dict)   # task id -> mode (fault_settings/airflow_local_settings.py)
    run_state: str = "failed"
    failed: tuple = ()                           # tasks that must end failed
    tries: dict = field(default_factory=dict)    # task id -> try number it must end on
    log: dict = field(default_factory=dict)      # task id -> text its last try's log must show
    driver: str | None = None                    # an external action while the run goes


def _fail(*tasks: str) -> Case:
    return Case(conf=SHORT, faults={t: "fail" for t in tasks}, failed=tasks, tries={t: 1 for t in tasks},
                log={t: "UC_E2E injected fault" for t in tasks})


CASES: dict[str, Case] = {
    # 1. A failure at each step: no retry (deterministic), downstream never runs, the teardowns clean up.
    "fail-preflight": _fail("preflight"),
    "fail-create_vpc": _fail("create_vpc"),
    "fail-render_config": _fail("render_config"),
    "fail-pcluster_create": _fail("pcluster_create"),
    "fail-wait_for_fleet": _fail("wait_for_fleet"),
    "fail-download_data+restore_compile_cache": _fail("download_data", "restore_compile_cache"),
    "fail-parallel_compile": _fail("parallel_compile"),
    "fail-collect_results+save_compile_cache": _fail("collect_results", "save_compile_cache"),
    # ... train, and each teardown's first try (the retry cleans up).
    "fail-train+teardowns-first-try": Case(
        conf=SHORT, faults={"train": "fail", "delete_cluster": "fail_first_try", "delete_vpc": "fail_first_try"},
        failed=("train",), tries={"train": 1, "delete_cluster": 2, "delete_vpc": 2}),
    # 2. CREATE_FAILED: failures[] in the log, no retry (the config causes it), the task deletes it.
    "create-failed": Case(
        conf={**SHORT, "extra_tags": {"local-ultracluster:fail-create": "OnNodeConfiguredExecutionFailure"}},
        failed=("pcluster_create",), tries={"pcluster_create": 1},
        log={"pcluster_create": "OnNodeConfiguredExecutionFailure"}),
    # 3. + 8. Three runs at once with different params, each with a fault it must ride out: the worker
    # SIGKILLed between sbatch and the deferral (the retry reattaches), the triggerer killed, sshd down.
    "sigkill-train-worker": Case(conf={**SHORT, "batch_size": 4}, faults={"train": "kill_before_defer"},
                                 run_state="success", tries={"train": 2}, driver="count_sbatch"),
    "triggerer-outage": Case(conf={**SHORT, "max_steps": 100, "steps_this_run": 100}, run_state="success",
                             tries={"train": 1}, driver="kill_triggerer"),
    "sshd-outage": Case(conf={**SHORT, "max_steps": 12, "steps_this_run": 12,
                              "extra_tags": {"local-ultracluster:boot-delay": "45"}},
                        run_state="success", driver="sshd_outages"),
    # 4. The user kills train while deferred: the job is cancelled, the teardowns still run.
    "mark-train-failed": Case(conf=LONG, failed=("train",), driver="patch_task"),
    # Airflow 3.3.2 keeps a run marked failed running for its teardowns, skips the pending normal
    # tasks, then judges the run by those leaves: it ends 'success' (docs/operations.md says so).
    "mark-run-failed": Case(conf=LONG, failed=("train",), driver="patch_run", run_state="success"),
    # 7. A node killed mid-train, auto-resume off: NODE_FAIL fails train at once (no Airflow retry:
    # it would start again from step 0), a clear failure, teardowns.
    "node-fail": Case(conf={**SHORT, "auto_resume_attempts": 0}, failed=("train",), tries={"train": 1},
                      log={"train": "auto-resume is off"}, driver="kill_node"),
    # The node health gate: one Neuron device missing on the node's first instance. train drains it,
    # ParallelCluster (the twin's clustermgtd) replaces it, and the resubmitted job passes the gate.
    "neuron-unhealthy": Case(conf={**SHORT, "extra_tags": {"local-ultracluster:neuron-unhealthy": UNHEALTHY_NODE}},
                             run_state="success", tries={"train": 1},
                             log={"train": f"Drained {UNHEALTHY_NODE}: UC health check failed: neuron"}),
    # Insufficient capacity: EC2 refuses every launch of the training node. parallel_compile's job never
    # starts; the lost-node rule waits out ParallelCluster's hold and submits it again once (node_replacements
    # 1); refused again, the node is lost twice and the task fails at once naming the EC2 error; teardowns.
    # The job's quick end also makes Airflow's defer/resume race (apache/airflow#72716): its first deferral's
    # process exits only once the resume runs, which must go on, on try 1 (ultracluster.executor).
    "insufficient-capacity": Case(
        conf={**SHORT, "extra_tags": {"local-ultracluster:insufficient-capacity": TRAINING_RESOURCE,
                                      "local-ultracluster:insufficient-capacity-timeout": str(ICE_HOLD_S)}},
        faults={"parallel_compile": "stale_defer_exit"},
        failed=("parallel_compile",), tries={"parallel_compile": 1},
        log={"parallel_compile": "EC2 had no capacity (InsufficientInstanceCapacity)"}, driver="count_launches"),
}
SUCCESS_GROUP = [name for name, case in CASES.items() if case.run_state == "success" and not case.failed]


@dataclass
class Run:
    case: str
    run_id: str
    cluster: Path
    refused: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    outage: Any = None


def _states(api, run_id: str) -> dict[str, dict]:
    tis = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {ti["task_id"]: ti for ti in tis}


def _train_job(run: Run) -> dict | None:
    name = slurm_job_name(DAG_ID, run.run_id, "train", -1, label=f"{DAG_ID}-train")
    return next((j for j in fa.jobs(run.cluster) if j["name"] == name), None)


def _drive(api, env, run: Run, tis: dict[str, dict]) -> None:
    """One step of the case's external action, from what the run shows now (polled every ~2 s)."""
    case, train = CASES[run.case], tis.get("train", {}).get("state")
    if case.driver == "count_sbatch":
        # Read while the cluster exists (its logs go with it): the last full reading is the count.
        name = slurm_job_name(DAG_ID, run.run_id, "train", -1, label=f"{DAG_ID}-train")
        every = fa.jobs(run.cluster, all_states=True)
        train_jobs = [j["id"] for j in every if j["name"] == name]
        submitted = fa.submissions(run.cluster)
        if train_jobs and submitted >= 0 and fa.submissions(run.cluster) == submitted:
            run.notes.update(train_jobs=train_jobs, submissions=submitted, jobs=sorted(j["id"] for j in every))
    elif case.driver == "count_launches":
        # Read while the cluster exists (its logs go with it): the last reading is the count.
        if (denied := fa.denied_launches(run.cluster)) >= 0:
            run.notes["denied_launches"] = denied
    elif case.driver in ("patch_task", "patch_run") and run.step == 0 and train == "deferred":
        job = _train_job(run)
        if job and job["state"] == "RUNNING":
            base = f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}"
            patched = time.monotonic()
            if case.driver == "patch_task":
                api.call("PATCH", f"{base}/taskInstances/train", {"new_state": "failed"})
            else:
                api.call("PATCH", base, {"state": "failed"})
            while any(j["id"] == job["id"] for j in fa.jobs(run.cluster)) and time.monotonic() - patched < 120:
                time.sleep(0.2)
            run.notes["patch_to_gone_s"] = round(time.monotonic() - patched, 1)
            run.step = 1
    elif case.driver == "kill_node":
        if run.outage is not None and run.outage.poll() is not None:
            run.notes.setdefault("node_kills", []).append(run.outage.returncode)
            run.outage = None
        job = _train_job(run) if train == "deferred" and run.outage is None else None
        if job and job["state"] == "RUNNING" and job["id"] not in run.notes.setdefault("killed_jobs", []):
            run.notes["killed_jobs"].append(job["id"])
            run.outage = fa.start_node_kill(run.cluster, 2)
    elif case.driver == "kill_triggerer" and run.step == 0 and train == "deferred":
        argv, environ = fa.kill_component(env["AIRFLOW_HOME"], "triggerer")
        run.notes["triggerer_killed_at"], run.step = time.monotonic(), 1
        run.notes["restart"] = (argv, environ)
    elif case.driver == "kill_triggerer" and run.step == 1:
        if time.monotonic() - run.notes["triggerer_killed_at"] >= OUTAGE_S:
            argv, environ = run.notes.pop("restart")
            fa.restart_component(env["AIRFLOW_HOME"], "triggerer", argv, environ)
            run.step = 2
    elif case.driver == "sshd_outages":
        # First outage while parallel_compile's job waits for its node (the boot delay keeps the node
        # powering up for 45 s), then one while train is deferred. Not during wait_for_fleet: a fleet of
        # dynamic nodes is ready at CREATE_COMPLETE, so that task lasts under a second, shorter than
        # this loop's poll: an outage aimed at it could land on the tasks after it.
        if run.outage is not None and run.outage.poll() is not None:
            run.notes.setdefault("outages", []).append(run.outage.returncode)
            run.outage = None
        wanted = {0: tis.get("parallel_compile", {}).get("state") == "deferred", 1: train == "deferred"}
        if run.outage is None and wanted.get(run.step):
            run.outage, run.step = fa.start_ssh_outage(run.cluster, OUTAGE_S), run.step + 1


@pytest.fixture(scope="module")
def matrix(request, airflow_local, e2e_home):
    """Trigger every selected case at once, drive their faults, wait for all: {case: Run}."""
    api, env = airflow_local
    selected = {item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    runs: dict[str, Run] = {}
    api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    try:
        yield _run_all(api, env, e2e_home, runs, selected)
    finally:  # paused again: later tests of the session must not meet a scheduled run
        api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": True})


def _run_all(api, env, e2e_home, runs: dict[str, Run], selected: set[str]) -> dict[str, Run]:
    started = time.monotonic()
    for name in [n for n in CASES if n in selected]:
        case = CASES[name]
        run_id = f"fault_{name.replace('+', '_')}_{secrets.token_hex(3)}"
        if case.faults:
            (Path(env["UC_E2E_FAULT_DIR"]) / f"{run_id}.json").write_text(json.dumps(case.faults))
        run = Run(name, run_id, fa.cluster_dir(e2e_home, cluster_name_for(run_id)))
        try:
            api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                     {"dag_run_id": run_id, "logical_date": None, "conf": case.conf})
        except urllib.error.HTTPError as err:
            run.refused = f"HTTP {err.code}: {err.read().decode()[:500]}"
        runs[name] = run
    live = [r for r in runs.values() if r.refused is None]
    while live:
        assert time.monotonic() - started < SUITE_TIMEOUT_S, {r.case: _states(api, r.run_id) for r in live}
        for run in list(live):
            tis = {t: ti for t, ti in _states(api, run.run_id).items()}
            _drive(api, env, run, {t: ti for t, ti in tis.items()})
            state = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}")["state"]
            if state in ("success", "failed") and all(
                    tis[t]["state"] in ("success", "failed", "skipped", "upstream_failed") for t in TEARDOWNS):
                run.notes["wall_s"] = round(time.monotonic() - started)
                live.remove(run)
        time.sleep(2)
    report = {name: {k: v for k, v in run.notes.items() if k != "restart"} for name, run in runs.items()}
    print(f"fault matrix: {len(runs)} runs in {time.monotonic() - started:.0f} s; {json.dumps(report)}")
    out = Path(__file__).resolve().parents[2] / "out" / "e2e"
    out.mkdir(parents=True, exist_ok=True)
    (out / "fault_matrix.json").write_text(json.dumps(report, indent=1) + "\n")  # for the docs (git-ignored)
    assert_nothing_left(env, e2e_home)
    return runs


@pytest.mark.parametrize("case", list(CASES))
def test_fault(matrix, airflow_local, case):
    api, env = airflow_local
    run, spec = matrix[case], CASES[case]
    if run.refused:
        pytest.fail(f"trigger refused: {run.refused}")
    state = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}")["state"]
    tis = _states(api, run.run_id)
    summary = {t: (ti["state"], ti["try_number"]) for t, ti in tis.items()}
    assert state == spec.run_state, summary
    for task in spec.failed:
        assert tis[task]["state"] == "failed", summary
    for task, tries in spec.tries.items():
        assert tis[task]["try_number"] == tries, summary
    if spec.run_state == "success" and not spec.failed:
        assert all(tis[task]["state"] == "success" for task in STEPS), summary
        assert not [t for t, ti in tis.items() if ti["state"] == "failed"], summary
    # The teardowns: run to success whenever their setup made something; else they need not run.
    for teardown, setup in (("delete_cluster", "pcluster_create"), ("delete_vpc", "create_vpc")):
        wanted = {"success"} if tis[setup]["state"] == "success" else {"skipped", "upstream_failed", "success"}
        assert tis[teardown]["state"] in wanted, (teardown, summary)
    for task, text in spec.log.items():
        log = task_log(api, run.run_id, task, tis[task]["try_number"])
        assert text in log, log[-3000:]
    if case == "create-failed":
        log = task_log(api, run.run_id, "pcluster_create", 1)
        # failures[] (code: reason, asserted above), the failed stack events, and no retry.
        assert "Last failed stack events" in log and "not retried" in log, log[-3000:]
    if spec.driver == "count_sbatch":
        # Exactly one sbatch for the train job, on the head node: one job of its name (squeue keeps
        # ended jobs for MinJobAge), and slurmctld's log holds no submission squeue does not show.
        assert len(run.notes.get("train_jobs", [])) == 1, run.notes
        assert run.notes["submissions"] == len(run.notes["jobs"]), run.notes
        assert "injected fault: SIGKILL" in task_log(api, run.run_id, "train", 1)
        assert "Reattaching to Slurm job" in task_log(api, run.run_id, "train", 2)
    if spec.driver in ("patch_task", "patch_run"):
        # Generous: the job must go before the teardowns (which would take it with the cluster) start.
        assert run.notes.get("patch_to_gone_s", 999) < 60, run.notes
        print(f"{case}: PATCH to the job leaving squeue {run.notes['patch_to_gone_s']} s (goal 5 s)")
    if spec.driver == "sshd_outages":
        assert run.notes.get("outages") == [0, 0], run.notes
    if spec.faults.get("parallel_compile") == "stale_defer_exit":
        # The race was made: the resume ran while the deferral's exit was read, and the executor dropped it.
        first = task_log(api, run.run_id, "parallel_compile", 1)
        assert "the resume holds on while the deferral's process exits" in first, first[-3000:]
        scheduler = (Path(env["AIRFLOW_HOME"]) / "logs" / "scheduler.log").read_text(errors="replace")
        assert any("deferral exit" in line and run.run_id in line for line in scheduler.splitlines())
    if spec.driver == "kill_node":
        assert run.notes.get("node_kills") == [0], run.notes
        assert "NODE_FAIL" in task_log(api, run.run_id, "train", 1)
    if spec.driver == "kill_triggerer":
        assert run.step == 2, run.notes
    if spec.driver == "count_launches":
        # Bounded: the first launch and one more after the hold (node_replacements=1), then no more.
        assert run.notes.get("denied_launches") == 2, run.notes
        log = task_log(api, run.run_id, "parallel_compile", 1)
        assert "never started: EC2 had no capacity" in log and "lost 2 time(s)" in log, log[-3000:]
        assert tis["train"]["state"] in ("upstream_failed", "skipped"), summary


def test_concurrent_runs_kept_apart(matrix, airflow_local):
    """8. The successful runs went at once with different params: each its own cluster, job directory,
    results (their global batch follows their own batch_size) and teardowns."""
    api, _ = airflow_local
    runs = [matrix[name] for name in SUCCESS_GROUP if name in matrix and matrix[name].refused is None]
    if len(runs) < 2:
        pytest.skip("needs at least two of the successful cases selected")
    seen: dict[str, set] = {"cluster": set(), "job_dir": set(), "results": set()}
    for run in runs:
        def xcom(task: str, run=run) -> dict:
            value = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}/taskInstances/{task}/"
                                    "xcomEntries/return_value")["value"]
            return value if isinstance(value, dict) else json.loads(value)
        conf = CASES[run.case].conf
        results, train = xcom("collect_results"), xcom("train")
        assert xcom("render_config")["cluster_name"] == cluster_name_for(run.run_id)
        assert results["global_batch"] == conf.get("batch_size", 8) * 2, (run.case, results)
        assert results["artifacts_uri"].endswith(f"/{safe_run_id(run.run_id)}/"), results["artifacts_uri"]
        seen["cluster"].add(cluster_name_for(run.run_id))
        seen["job_dir"].add(train["output_dir"].rsplit("/output_", 1)[0])
        seen["results"].add(results["artifacts_uri"])
    assert all(len(values) == len(runs) for values in seen.values()), seen


def test_no_secret_in_the_fault_runs_logs(matrix, airflow_local):
    """Every task log of every run of the matrix, every try (faults make retries, kills, restarts), is free
    of AWS keys, session tokens, presigned URL signatures and passwords (tests/log_scan.py)."""
    _, env = airflow_local
    logs = Path(env["AIRFLOW_HOME"]) / "logs" / f"dag_id={DAG_ID}"
    texts = {}
    for run in matrix.values():
        found = read_logs(logs / f"run_id={run.run_id}") if (logs / f"run_id={run.run_id}").is_dir() else {}
        texts.update({f"{run.run_id}/{name}": text for name, text in found.items()})
        assert found or run.refused, f"no task log of {run.case} under {logs}"
    assert len(texts) >= len(matrix), sorted(texts)
    leaks = scan(texts, deployment_secrets(env))
    assert not leaks, "\n".join(map(str, leaks[:40]))
