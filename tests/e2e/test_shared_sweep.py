"""A sweep on one cluster (#25 item 2) under a real scheduler and triggerer: trn1_sweep_cluster makes one
cluster for the largest point, the points train on it (queued by Slurm where the nodes run short), the
report bills each point from its jobs and shows the shared overhead on a line of its own, and nothing
is left. Once through the client (`ultracluster sweep --cluster shared`), once as the UI does it: the
holder triggered with the sweep conf, then a backfill with the same conf."""
from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import (DAG_ID, NODE_CAP, RUN_TIMEOUT_S, RUNTIME_READY, TASK_IDS, assert_nothing_left, s3_client,
                                wait_all_runs_ended)
from tests.e2e.test_cli_e2e import ultracluster
from tests.e2e.test_sweep import REPORT_DAG_ID, published_report, unpaused, xcom  # noqa: F401 - unpaused is a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

HOLDER = "trn1_sweep_cluster"
HOLDER_TASKS = {"preflight", "create_vpc", "render_config", "pcluster_create", "hold_cluster", "delete_cluster",
                "delete_vpc"}
# A point on the shared cluster creates and deletes nothing (test_pipeline.py's SKIPPED_ON_EXISTING).
POINT_STATES = {task: "skipped" if task in ("render_config", "delete_cluster", "delete_vpc") else "success"
                for task in TASK_IDS}
BOUNDED = {"max_steps": 40, "steps_this_run": 12}


def ledger_lines(e2e_home) -> list[dict]:
    path = e2e_home / "logs" / "clusters.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def results_json(env, metrics: dict) -> dict:
    key = metrics["artifacts_uri"].removeprefix("s3://ultracluster-artifacts/") + "results.json"
    return json.loads(s3_client(env["AWS_ENDPOINT_URL"]).get_object(Bucket="ultracluster-artifacts", Key=key)["Body"]
                      .read())


def check_points(api, env, point_runs: dict[int, str], cluster: str) -> dict[int, dict]:
    """Every point trained on ``cluster``, billed from its own jobs; the dataset was downloaded once."""
    results, downloads = {}, []
    for nodes, run_id in point_runs.items():
        assert api.task_states(DAG_ID, run_id) == POINT_STATES, (nodes, run_id)
        adopted = xcom(api, DAG_ID, run_id, "pcluster_create")
        assert (adopted["cluster_name"], adopted["existing"]) == (cluster, True), adopted
        downloads.append(xcom(api, DAG_ID, run_id, "download_data")["skipped"])
        body = results_json(env, xcom(api, DAG_ID, run_id, "collect_results"))
        assert body["results"]["parameters"]["Number of nodes"] == nodes
        usage = body["usage"]
        assert (usage["basis"], usage["cluster_name"]) == ("slurm_jobs", cluster) and usage["usd"] > 0, usage
        assert {job["nodes"] for job in usage["jobs"]} == {nodes}, usage["jobs"]
        results[nodes] = body
    assert sorted(downloads) == [False] + [True] * (len(point_runs) - 1), downloads   # downloaded once
    return results


def check_holder(api, run_id: str, cluster: str) -> dict:
    assert api.task_states(HOLDER, run_id) == {task: "success" for task in HOLDER_TASKS}
    # It waited in the triggerer: one deferral, however long the points took.
    assert api.deferrals(HOLDER, run_id, "hold_cluster") == 1
    held = xcom(api, HOLDER, run_id, "hold_cluster")
    assert held["cluster_name"] == cluster and set(held["runs"].values()) == {"success"}, held
    billed = xcom(api, HOLDER, run_id, "delete_cluster")
    assert billed["usage"]["basis"] == "ec2_instances" and billed["usage"]["usd"] > 0, billed
    return billed["usage"]


def check_report(report: dict, results: dict[int, dict], cluster_usage: dict) -> None:
    rows = {row["nodes"]: row for row in report["rows"]}
    assert sorted(rows) == sorted(results)
    for nodes, body in results.items():
        measured = {m["MetricName"]: m["MeasuredValue"] for m in body["results"]["metrics"]}
        assert rows[nodes]["average_throughput_seq_per_s"] == pytest.approx(measured["Average throughput"])
        assert (rows[nodes]["cost_basis"], rows[nodes]["cost_usd"]) == ("slurm_jobs", body["usage"]["usd"])
    line = next((line for line in report["markdown"].splitlines() if line.startswith("| Shared cluster |")), None)
    assert line is not None, report["markdown"]
    # The overhead (run.shared_cluster.overhead): the head node and FSx, and the compute time no
    # point's job used; the bill's parts are rounded to cents.
    points_usd = sum(body["usage"]["usd"] for body in results.values())
    head, fsx = cluster_usage.get("head_node_usd") or 0.0, cluster_usage.get("fsx_usd") or 0.0
    compute = cluster_usage.get("compute_usd") or cluster_usage["usd"] - head - fsx
    expected = head + fsx + max(0.0, compute - points_usd)
    assert expected > 0 and "not billed yet" not in line, line
    shown = float(line.split("|")[-3].strip().replace(",", ""))
    assert shown == pytest.approx(expected, abs=0.03), line


def one_cluster_made(new_lines: list[dict], cluster: str, size: int, holder_run: str, point_runs: dict) -> None:
    """From the local cluster's ledger: the holder made one cluster, of the largest point; no point made one."""
    created = [line for line in new_lines if line["event"] == "created"]
    mine = [(c["cluster"], int(c["tags"].get("ultracluster:nodes") or 0)) for c in created
            if c["tags"].get("ultracluster:run-id") in (holder_run, *point_runs.values())]
    assert mine == [(cluster, size)] and size <= NODE_CAP, created


def test_a_client_sweep_on_one_cluster(airflow_local, e2e_home, unpaused):
    """`ultracluster sweep --cluster shared`, 3 points: one cluster of 3 nodes; points 1 and 2 fill it,
    point 3 waits for their nodes (the fleet wait, then Slurm), all succeed; the report after the
    holder ended shows each point's own bill and the shared overhead; nothing left."""
    api, env = airflow_local
    before = len(ledger_lines(e2e_home))
    done = ultracluster(api.base, "--password", api.password, "sweep", "--id", "e2e-shared", "--nodes", "1,2,3",
                        "--mode", "weak", "--cluster", "shared", "--param", "max_steps=40",
                        "--param", "steps_this_run=12", "--poll-interval", "5", "--timeout", str(RUN_TIMEOUT_S),
                        timeout=RUN_TIMEOUT_S + 120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    lines = done.stdout.splitlines()
    holder_run = next(line.rsplit(" run ", 1)[1] for line in lines if f"shared cluster: {HOLDER} run" in line)
    point_runs = {int(line.split("num_nodes=")[1].split()[0]): line.rsplit(" run ", 1)[1]
                  for line in lines if line.startswith("sweep e2e-shared: num_nodes=")}
    assert sorted(point_runs) == [1, 2, 3], done.stdout
    assert not any("shared network" in line for line in lines)   # the holder's cluster has its own

    cluster = "uc-sweep-e2e-shared"
    results = check_points(api, env, point_runs, cluster)
    cluster_usage = check_holder(api, holder_run, cluster)
    one_cluster_made(ledger_lines(e2e_home)[before:], cluster, 3, holder_run, point_runs)

    done = ultracluster(api.base, "--password", api.password, "report", "e2e-shared", "--poll-interval", "3",
                        timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    report_run = next(line.split(" run ", 1)[1].split()[0] for line in done.stdout.splitlines()
                      if line.startswith(f"triggered {REPORT_DAG_ID} run "))
    check_report(xcom(api, REPORT_DAG_ID, report_run, "build_report"), results, cluster_usage)
    assert_nothing_left(env, e2e_home)


# Three consecutive weekly ticks, apart from test_sweep.py's and test_ui_browser.py's.
TICKS = ["2026-08-30T00:00:00Z", "2026-09-06T00:00:00Z", "2026-09-13T00:00:00Z"]


def test_a_backfilled_sweep_on_one_cluster_as_the_ui_does_it(airflow_local, e2e_home, unpaused):
    """The UI's way: trigger trn1_sweep_cluster with the sweep conf, then backfill the pipeline with the
    same conf: each tick's point trains on the holder's cluster; the report the points' results
    events schedule waits for the holder's bill and shows the shared overhead."""
    api, env = airflow_local
    before = len(ledger_lines(e2e_home))
    sweep = {"id": "e2e-shared-bf", "num_nodes": [1, 2, 3], "scaling_mode": "weak", "cluster": "shared"}
    conf = {"sweep": sweep, **BOUNDED}
    holder_run = api.call("POST", f"/api/v2/dags/{HOLDER}/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while api.task_states(HOLDER, holder_run).get("pcluster_create") != "success":
        assert api.call("GET", f"/api/v2/dags/{HOLDER}/dagRuns/{holder_run}")["state"] in ("queued", "running")
        assert time.monotonic() < deadline
        time.sleep(3)
    api.call("POST", "/api/v2/backfills", {
        "dag_id": DAG_ID, "from_date": TICKS[0], "to_date": TICKS[-1], "dag_run_conf": conf,
        "max_active_runs": 3, "reprocess_behavior": "none"})
    assert api.wait_for_run(HOLDER, holder_run, 2 * RUN_TIMEOUT_S) == "success"
    ticks = {tick.replace("Z", "+00:00") for tick in TICKS}
    runs = [r for r in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=backfill&limit=100")["dag_runs"]
            if (r.get("logical_date") or "").replace("Z", "+00:00") in ticks]
    assert len(runs) == 3 and all(r["state"] == "success" for r in runs), runs
    point_runs = {xcom(api, DAG_ID, r["dag_run_id"], "preflight")["plan"]["num_nodes"]: r["dag_run_id"] for r in runs}
    assert sorted(point_runs) == [1, 2, 3]
    cluster = "uc-sweep-e2e-shared-bf"
    results = check_points(api, env, point_runs, cluster)
    cluster_usage = check_holder(api, holder_run, cluster)
    one_cluster_made(ledger_lines(e2e_home)[before:], cluster, 3, holder_run, point_runs)
    check_report(published_report(api, sweep["id"], timeout_s=600), results, cluster_usage)
    # Unpaused with catchup=False, Airflow also runs the latest weekly tick once: let it end.
    wait_all_runs_ended(api)
    assert_nothing_left(env, e2e_home)
