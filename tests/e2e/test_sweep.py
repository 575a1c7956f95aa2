"""Scaling sweeps under a real scheduler and triggerer: refused confs, and a backfilled 3-point sweep
(one point per weekly tick) on the local UltraCluster, then its scaling report."""
from __future__ import annotations

import json
import time
import urllib.error

import pytest

from tests.e2e.conftest import (DAG_ID, NODE_CAP, RUN_TIMEOUT_S, RUNTIME_READY, TASK_IDS, assert_nothing_left, s3_client,
                                task_log, wait_all_runs_ended)
from tests.e2e.test_cli_e2e import ultracluster

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

REPORT_DAG_ID = "trn1_scaling_report"
# Three consecutive weekly ticks (Sundays 00:00 UTC): each picks a different point.
TICKS = ["2026-11-08T00:00:00Z", "2026-11-15T00:00:00Z", "2026-11-22T00:00:00Z"]
SWEEP = {"id": "e2e-backfill", "num_nodes": [1, 2, 3], "scaling_mode": "weak"}
# A bounded run per point: 12 of 40 steps, so time to train is extrapolated.
SWEEP_CONF = {"sweep": SWEEP, "max_steps": 40, "steps_this_run": 12}


def refused(api, method: str, path: str, body: dict) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as err:
        api.call(method, path, body)
    return err.value.code, err.value.read().decode()


@pytest.mark.parametrize("sweep", [
    {"id": "s1", "num_nodes": []},  # a sweep of 0 points
    {"id": "s1", "num_nodes": [1, 2], "scaling_mode": "linear"},
    {"id": "Bad Id", "num_nodes": [1]},
])
def test_bad_sweeps_are_refused_at_trigger_time(airflow_local, sweep):
    api, _ = airflow_local
    code, body = refused(api, "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"sweep": sweep}})
    assert code == 400, body
    code, body = refused(api, "POST", "/api/v2/backfills", {
        "dag_id": DAG_ID, "from_date": TICKS[0], "to_date": TICKS[-1], "dag_run_conf": {"sweep": sweep}})
    assert code == 422, body


def backfill_runs(api) -> list[dict]:
    """The backfill's runs (a run does not name its backfill: its run type and logical date do)."""
    runs = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=backfill&limit=100")["dag_runs"]
    ticks = {tick.replace("Z", "+00:00") for tick in TICKS}
    return [r for r in runs if (r.get("logical_date") or "").replace("Z", "+00:00") in ticks]


@pytest.fixture
def unpaused(airflow_local):
    """Both DAGs unpaused for the test, paused again whatever happens: the browser test shares
    this Airflow and must not meet a scheduled run left behind."""
    api, _ = airflow_local
    for dag_id in (DAG_ID, REPORT_DAG_ID):
        api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    yield
    for dag_id in (DAG_ID, REPORT_DAG_ID):
        api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})


def test_a_backfilled_sweep_trains_one_point_per_tick_and_is_reported(airflow_local, e2e_home, unpaused):
    api, env = airflow_local
    api.call("POST", "/api/v2/backfills", {
        "dag_id": DAG_ID, "from_date": TICKS[0], "to_date": TICKS[-1], "dag_run_conf": SWEEP_CONF,
        "max_active_runs": 3, "reprocess_behavior": "none"})
    deadline = time.monotonic() + 2 * RUN_TIMEOUT_S
    while True:
        runs = backfill_runs(api)
        if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs):
            break
        assert time.monotonic() < deadline, runs
        time.sleep(5)
    for run in runs:
        states = api.task_states(DAG_ID, run["dag_run_id"])
        assert states == {task: "success" for task in TASK_IDS}, (run["dag_run_id"], states)

    s3 = s3_client(env["AWS_ENDPOINT_URL"])
    results = {}
    for run in runs:
        xcom = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances/"
                               "collect_results/xcomEntries/return_value")
        metrics = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
        assert metrics["sweep"]["id"] == SWEEP["id"] and metrics["time_to_train_extrapolated"] is True
        key = metrics["artifacts_uri"].removeprefix("s3://ultracluster-artifacts/") + "results.json"
        body = json.loads(s3.get_object(Bucket="ultracluster-artifacts", Key=key)["Body"].read())
        parameters = body["results"]["parameters"]
        assert parameters["Sweep"]["num_nodes"] == parameters["Number of nodes"] == metrics["nodes"]
        # delete_cluster billed the run from EC2: the head node and each compute node that came up.
        usage = body["usage"]
        assert usage["basis"] == "ec2_instances" and usage["unended"] == 0, usage
        assert usage["instances"] >= 1 + metrics["nodes"] and usage["compute_node_hours"] > 0 and usage["usd"] > 0
        results[metrics["nodes"]] = body
    assert sorted(results) == [1, 2, 3]  # three ticks, three distinct points

    # The last run's results Asset event schedules the report; it reports once all three ended.
    report = published_report(api, SWEEP["id"])
    rows = {row["nodes"]: row for row in report["rows"]}
    assert sorted(rows) == [1, 2, 3]
    for nodes, body in results.items():
        measured = {m["MetricName"]: m["MeasuredValue"] for m in body["results"]["metrics"]}
        assert rows[nodes]["average_throughput_seq_per_s"] == pytest.approx(measured["Average throughput"])
        assert rows[nodes]["final_loss"] == pytest.approx(measured["Final loss"])
        assert rows[nodes]["world_size"] == body["results"]["parameters"]["World size"]
        assert (rows[nodes]["cost_basis"], rows[nodes]["cost_usd"]) == ("ec2_instances", body["usage"]["usd"])
    # The report names what really trained (issue 25): BERT-tiny on the local nodes' CPUs, so Neuron's
    # BERT-large figures stay out of it.
    assert report["markdown"].startswith(f"# BERT-tiny scaling on CPU: sweep {SWEEP['id']}\n"), report["markdown"]
    assert {(row["model"], row["device"]) for row in report["rows"]} == {("BERT-tiny", "cpu")}
    assert "reference: " not in report["markdown"]
    prefix = report["uri"].removeprefix("s3://ultracluster-artifacts/")
    listed = {o["Key"].rsplit("/", 1)[-1]: o["Size"]
              for o in s3.list_objects_v2(Bucket="ultracluster-artifacts", Prefix=prefix)["Contents"]}
    assert {"report.md", "report.html", "report.json", "throughput.png"} <= set(listed), listed
    png = s3.get_object(Bucket="ultracluster-artifacts", Key=f"{prefix.rstrip('/')}/throughput.png")["Body"].read()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000

    # The backfill moved the schedule on: unpaused with catchup=False, Airflow also runs the latest
    # weekly tick once (docs/operations.md). Let every run end, then nothing may be left.
    wait_all_runs_ended(api)
    assert_nothing_left(env, e2e_home)
    check_node_cap(e2e_home / "logs" / "clusters.jsonl")


def check_node_cap(ledger) -> None:
    """From the local cluster's own ledger: never more than NODE_CAP nodes' clusters alive at once.
    The backfill starts its three points together, so without the cap the 3-node cluster (point 3)
    would sit beside the 1- and 2-node ones (each point's cluster is sized to it): 6 nodes."""
    alive, peak, sizes = {}, 0, []
    for line in ledger.read_text().splitlines():
        entry = json.loads(line)
        nodes = int(entry["tags"].get("ultracluster:nodes") or 0)
        if entry["event"] == "created":
            alive[entry["cluster"]] = nodes
            sizes.append(nodes)
            peak = max(peak, sum(alive.values()))
        else:
            alive.pop(entry["cluster"], None)
    assert 3 in sizes and peak <= NODE_CAP, (sizes, peak)
    assert alive == {}, alive


def published_report(api, sweep_id: str, timeout_s: float = 300) -> dict:
    """build_report's return value in the newest report run that published sweep ``sweep_id``
    (scheduled by the points' results events; other sweeps' reports share the DAG)."""
    deadline = time.monotonic() + timeout_s
    while True:
        reports = api.call("GET", f"/api/v2/dags/{REPORT_DAG_ID}/dagRuns?order_by=-id&limit=100")["dag_runs"]
        for run in reports:
            if (run["state"] == "success"
                    and api.task_states(REPORT_DAG_ID, run["dag_run_id"]).get("build_report") == "success"):
                report = xcom(api, REPORT_DAG_ID, run["dag_run_id"], "build_report")
                if report.get("sweep_id") == sweep_id:
                    return report
        assert time.monotonic() < deadline, reports
        time.sleep(5)


def xcom(api, dag_id: str, run_id: str, task_id: str):
    value = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/"
                            "return_value")["value"]
    return value if not isinstance(value, str) else json.loads(value)


def test_a_client_fan_out_shares_one_network_and_reports_like_a_backfill(airflow_local, e2e_home, unpaused):
    """`ultracluster sweep --via runs`: one network for both points (trn1_sweep_network), one run per
    point naming its point, the network deleted after the last; `ultracluster report` gives the rows
    of the runs' results.json, as the backfilled sweep's report does."""
    api, env = airflow_local
    done = ultracluster(api.base, "--password", api.password, "sweep", "--id", "e2e-fanout", "--nodes", "1,2",
                        "--mode", "weak", "--param", "max_steps=40", "--param", "steps_this_run=12",
                        "--poll-interval", "5", "--timeout", str(RUN_TIMEOUT_S), timeout=RUN_TIMEOUT_S + 120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    lines = done.stdout.splitlines()
    network_run = next(line.rsplit(" run ", 1)[1] for line in lines if "shared network: trn1_sweep_network run" in line)
    point_runs = {int(line.split("num_nodes=")[1].split()[0]): line.rsplit(" run ", 1)[1]
                  for line in lines if line.startswith("sweep e2e-fanout: num_nodes=")}
    assert sorted(point_runs) == [1, 2], done.stdout
    assert api.task_states("trn1_sweep_network", network_run) == {
        "create_vpc": "success", "hold_network": "success", "delete_vpc": "success"}
    # The hold waits in the triggerer until the last point ends: one deferral, not one per look.
    hold_log = task_log(api, network_run, "hold_network", dag_id="trn1_sweep_network")
    assert hold_log.count("Pausing task as DEFERRED") == 1, hold_log[-3000:]
    vpc_id = xcom(api, "trn1_sweep_network", network_run, "create_vpc")["vpc_id"]
    s3 = s3_client(env["AWS_ENDPOINT_URL"])
    results = {}
    for nodes, run_id in point_runs.items():
        assert api.task_states(DAG_ID, run_id) == {task: "success" for task in TASK_IDS}, run_id
        network = xcom(api, DAG_ID, run_id, "create_vpc")
        assert network["vpc_id"] == vpc_id and network["owned"] is False, network   # adopted, not made
        metrics = xcom(api, DAG_ID, run_id, "collect_results")
        key = metrics["artifacts_uri"].removeprefix("s3://ultracluster-artifacts/") + "results.json"
        results[nodes] = json.loads(s3.get_object(Bucket="ultracluster-artifacts", Key=key)["Body"].read())

    done = ultracluster(api.base, "--password", api.password, "report", "e2e-fanout", "--poll-interval", "3",
                        timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    report_run = next(line.split(" run ", 1)[1].split()[0] for line in done.stdout.splitlines()
                      if line.startswith(f"triggered {REPORT_DAG_ID} run "))
    report = xcom(api, REPORT_DAG_ID, report_run, "build_report")
    rows = {row["nodes"]: row for row in report["rows"]}
    assert sorted(rows) == [1, 2]
    for nodes, body in results.items():
        measured = {m["MetricName"]: m["MeasuredValue"] for m in body["results"]["metrics"]}
        assert rows[nodes]["average_throughput_seq_per_s"] == pytest.approx(measured["Average throughput"])
        assert rows[nodes]["cost_usd"] == body["usage"]["usd"]
    assert "| Nodes |" in done.stdout or "Nodes" in done.stdout
    assert_nothing_left(env, e2e_home)
