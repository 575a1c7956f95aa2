"""`ultracluster sweep` against a real HTTP server (tests/unit/airflow_stub.py): the fan-out's runs,
the backfill's dates for a fixed now, and that window against Airflow 3.3's own backfill planning."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.unit.airflow_stub import DAG, StubAirflow, cli, one_error_line, run, timeless, tis, token_request
from tests.unit.airflow_stub import no_ambient_config, stub  # noqa: F401 - fixtures
from ultracluster.cli.sweeps import past_ticks
from ultracluster.run.sweep import sweep_point

NOW = datetime(2026, 4, 15, 10, 0, tzinfo=timezone.utc)  # a Wednesday
UTC = timezone.utc


def test_sweep_fan_out_triggers_one_run_per_point(stub, capsys):
    ids = [f"manual__2026-04-15T10:00:0{i}+00:00" for i in range(3)]
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", *(run(run_id, "queued") for run_id in ids))
    for run_id in ids:
        stub.on("GET", f"{DAG}/dagRuns/{run_id}", run(run_id, "running"), run(run_id, "success"))
        stub.on("GET", f"{DAG}/dagRuns/{run_id}/taskInstances?limit=100", tis(("train", "success", 5.0)))

    assert cli(stub, "sweep", "--id", "s1", "--nodes", "1,2,4", "--mode", "weak", "--param", "max_nodes=4",
               "--network", "per-run") == 0
    sweep = {"id": "s1", "num_nodes": [1, 2, 4], "scaling_mode": "weak"}
    posted = [body for method, path, body in stub.requests if method == "POST" and path.endswith("/dagRuns")]
    assert posted == [{"logical_date": None, "conf": {"max_nodes": 4, "sweep": {**sweep, "point": {"num_nodes": n}}}}
                      for n in (1, 2, 4)]
    out = timeless(capsys.readouterr().out)
    assert out.startswith("".join(f"sweep s1: num_nodes={n}  run {run_id}\n" for n, run_id in zip((1, 2, 4), ids)))
    assert "  [n=4] train                  success            Ts\n" in out
    assert out.endswith(f"[n=4] run {ids[2]} finished: success in T s\nsweep s1: 3/3 runs succeeded\n")


def runs_query(dates: list[str]) -> str:
    """How the client lists a backfill's runs: by run type, within its dates."""
    return f"{DAG}/dagRuns?run_type=backfill&logical_date_gte={dates[0]}&logical_date_lte={dates[-1]}&limit=100"


def backfill_routes(stub: StubAirflow, dates: list[str], *, dry_run: list[str] | None = None) -> list[str]:
    stub.on("POST", "/api/v2/backfills/dry_run", (200, {
        "backfills": [{"logical_date": d, "partition_key": None, "partition_date": None} for d in dry_run or dates],
        "total_entries": len(dry_run or dates)}))
    stub.on("GET", DAG, (200, {"is_paused": True}))
    stub.on("PATCH", DAG, (200, {"is_paused": False}))
    stub.on("POST", "/api/v2/backfills", (200, {"id": 7, "dag_id": "trn1_bert_pretrain"}))
    ids = [f"backfill__{d.replace('Z', '+00:00')}" for d in dates]
    stub.on("GET", runs_query(dates),
            (200, {"dag_runs": [run(i, "queued", logical_date=d, run_type="backfill")[1] for i, d in zip(ids, dates)],
                   "total_entries": 3}))
    for run_id in ids:
        stub.on("GET", f"{DAG}/dagRuns/{run_id}", run(run_id, "running"), run(run_id, "success"))
        stub.on("GET", f"{DAG}/dagRuns/{run_id}/taskInstances?limit=100", tis(("train", "success", 5.0)))
    return ids


def test_sweep_via_backfill_covers_the_last_weekly_ticks(stub, capsys):
    dates = ["2026-03-29T00:00:00Z", "2026-04-05T00:00:00Z", "2026-04-12T00:00:00Z"]  # the Sundays before NOW
    ids = backfill_routes(stub, dates)

    assert cli(stub, "sweep", "--id", "s1", "--nodes", "1,2,4", "--via", "backfill", "--network", "per-run",
               now=NOW) == 0
    body = {"dag_id": "trn1_bert_pretrain", "from_date": dates[0], "to_date": dates[-1], "run_backwards": False,
            "dag_run_conf": {"sweep": {"id": "s1", "num_nodes": [1, 2, 4], "scaling_mode": "strong"}},
            "reprocess_behavior": "completed", "max_active_runs": 1}
    assert stub.requests[:6] == [
        token_request(),
        ("POST", "/api/v2/backfills/dry_run", body),
        ("GET", DAG, None),
        ("PATCH", DAG, {"is_paused": False}),
        ("POST", "/api/v2/backfills", body),
        ("GET", runs_query(dates), None),
    ]
    # The DAG's own rule (ultracluster.run.sweep) gives each date its point: every point once, and
    # here (week 169 since 2023-01-01 first: 169 % 3 = 1) from the second point on, as the plan says.
    points = [sweep_point(body["dag_run_conf"]["sweep"], datetime.fromisoformat(d), timedelta(days=7))["num_nodes"]
              for d in dates]
    assert points == [2, 4, 1]
    out = timeless(capsys.readouterr().out)
    assert out.startswith(
        f"sweep s1: backfill trn1_bert_pretrain from {dates[0]} to {dates[-1]}; the dry run plans 3 runs, "
        "each training the point of its week (weeks since 2023-01-01 modulo 3):\n"
        f"  {dates[0]}  num_nodes=2 (point 2/3)\n  {dates[1]}  num_nodes=4 (point 3/3)\n"
        f"  {dates[2]}  num_nodes=1 (point 1/3)\n"
        + "unpaused trn1_bert_pretrain\nsweep s1: backfill 7 created\n"
        + "".join(f"  [n={n} {d[:10]}] run {i}\n" for d, n, i in zip(dates, points, ids))), out
    assert out.endswith("sweep s1: 3/3 runs succeeded\n")


def test_sweep_dry_run_creates_nothing(stub, capsys):
    dates = ["2026-04-05T00:00:00Z", "2026-04-12T00:00:00Z"]
    backfill_routes(stub, dates)
    assert cli(stub, "sweep", "--id", "s1", "--nodes", "2,4", "--via", "backfill", "--max-active", "2",
               "--dry-run", now=NOW) == 0
    assert [(method, path) for method, path, _ in stub.requests] == [
        ("POST", "/auth/token"), ("POST", "/api/v2/backfills/dry_run")]
    assert stub.requests[1][2]["max_active_runs"] == 2


def test_a_dry_run_that_misses_a_tick_stops_the_sweep(stub, capsys):
    dates = ["2026-03-29T00:00:00Z", "2026-04-05T00:00:00Z", "2026-04-12T00:00:00Z"]
    backfill_routes(stub, dates, dry_run=dates[:2])
    assert cli(stub, "sweep", "--id", "s1", "--nodes", "1,2,4", "--via", "backfill", now=NOW) == 2
    assert "a run at one of them is still in flight" in one_error_line(capsys.readouterr().err)
    assert ("POST", "/api/v2/backfills") not in [(method, path) for method, path, _ in stub.requests]


def test_a_rejected_backfill_prints_the_servers_message(stub, capsys):
    dates = ["2026-04-12T00:00:00Z"]
    backfill_routes(stub, dates)
    already = "There is already a running backfill for dag trn1_bert_pretrain"
    stub.on("POST", "/api/v2/backfills", (409, {"detail": already}))
    assert cli(stub, "sweep", "--id", "s1", "--nodes", "4", "--via", "backfill", "--network", "per-run",
               now=NOW) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"Airflow rejected POST /api/v2/backfills (HTTP 409): {already}")


NET_DAG = "/api/v2/dags/trn1_sweep_network"
NET_RUN = "manual__2026-04-15T09:59:59+00:00"
NETWORK = {"vpc_id": "vpc-1", "public_subnet_id": "subnet-pub", "private_subnet_id": "subnet-priv",
           "security_group_id": "sg-1", "availability_zone": "us-east-1a", "owned": True}
ADOPTED = {"existing_vpc_id": "vpc-1", "existing_public_subnet_id": "subnet-pub",
           "existing_private_subnet_id": "subnet-priv", "existing_security_group_id": "sg-1"}


def network_routes(stub: StubAirflow) -> None:
    stub.on("GET", NET_DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{NET_DAG}/dagRuns", run(NET_RUN, "queued"))
    stub.on("GET", f"{NET_DAG}/dagRuns/{NET_RUN}/taskInstances?limit=100",
            tis(("create_vpc", "running", None)), tis(("create_vpc", "success", 3.0)),
            tis(("create_vpc", "success", 3.0), ("hold_network", "success", 9.0), ("delete_vpc", "success", 2.0)))
    stub.on("GET", f"{NET_DAG}/dagRuns/{NET_RUN}", run(NET_RUN, "running"), run(NET_RUN, "success"))
    stub.on("GET", f"{NET_DAG}/dagRuns/{NET_RUN}/taskInstances/create_vpc/xcomEntries/return_value",
            (200, {"key": "return_value", "value": NETWORK}))


def test_a_fan_out_shares_one_network_that_outlives_its_points(stub, capsys):
    network_routes(stub)
    ids = [f"manual__2026-04-15T10:00:0{i}+00:00" for i in range(2)]
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", *(run(run_id, "queued") for run_id in ids))
    for run_id in ids:
        stub.on("GET", f"{DAG}/dagRuns/{run_id}", run(run_id, "success"))
        stub.on("GET", f"{DAG}/dagRuns/{run_id}/taskInstances?limit=100", tis(("train", "success", 5.0)))

    assert cli(stub, "sweep", "--id", "s1", "--nodes", "1,2", "--param", "artifacts_s3_uri=s3://b/x",
               "--poll-interval", "0.01") == 0
    posts = [(path, body) for method, path, body in stub.requests if method == "POST" and path.endswith("/dagRuns")]
    # The network first (its hold waits for 2 runs of s1 indexed under the same artifacts), then the points.
    assert posts[0] == (f"{NET_DAG}/dagRuns", {"logical_date": None, "conf": {
        "sweep_id": "s1", "points": 2, "artifacts_s3_uri": "s3://b/x"}})
    sweep = {"id": "s1", "num_nodes": [1, 2], "scaling_mode": "strong"}
    assert [body["conf"] for _, body in posts[1:]] == [
        {"artifacts_s3_uri": "s3://b/x", **ADOPTED, "sweep": {**sweep, "point": {"num_nodes": n}}} for n in (1, 2)]
    out = timeless(capsys.readouterr().out)
    assert f"sweep s1: shared network: trn1_sweep_network run {NET_RUN}\n" in out
    assert "sweep s1: network vpc-1 is up; every point adopts it\n" in out
    # The client follows the network's run to its delete_vpc too.
    assert "  [network] delete_vpc             success            Ts\n" in out
    assert out.endswith("sweep s1: 2/2 runs succeeded\n")


def test_a_backfill_that_cannot_start_releases_the_shared_network(stub, capsys):
    network_routes(stub)
    dates = ["2026-04-12T00:00:00Z"]
    backfill_routes(stub, dates)
    stub.on("POST", "/api/v2/backfills", (409, {"detail": "There is already a running backfill"}))
    stub.on("PATCH", f"{NET_DAG}/dagRuns/{NET_RUN}/taskInstances/hold_network", (200, {}))
    assert cli(stub, "sweep", "--id", "s1", "--nodes", "4", "--via", "backfill", "--poll-interval", "0.01",
               now=NOW) == 2
    backfill = next(body for method, path, body in stub.requests if (method, path) == ("POST", "/api/v2/backfills"))
    assert {k: backfill["dag_run_conf"][k] for k in ADOPTED} == ADOPTED   # every backfilled run adopts it
    assert ("PATCH", f"{NET_DAG}/dagRuns/{NET_RUN}/taskInstances/hold_network", {"new_state": "success"}) in stub.requests
    assert "releasing the network" in capsys.readouterr().out


HOLDER_DAG = "/api/v2/dags/trn1_sweep_cluster"
HOLDER_RUN = "manual__2026-04-15T09:59:58+00:00"


def holder_routes(stub: StubAirflow) -> None:
    stub.on("GET", HOLDER_DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{HOLDER_DAG}/dagRuns", run(HOLDER_RUN, "queued"))
    stub.on("GET", f"{HOLDER_DAG}/dagRuns/{HOLDER_RUN}/taskInstances?limit=100",
            tis(("pcluster_create", "deferred", None)), tis(("pcluster_create", "success", 30.0)),
            tis(("pcluster_create", "success", 30.0), ("hold_cluster", "success", 9.0),
                ("delete_cluster", "success", 20.0), ("delete_vpc", "success", 2.0)))
    stub.on("GET", f"{HOLDER_DAG}/dagRuns/{HOLDER_RUN}", run(HOLDER_RUN, "running"), run(HOLDER_RUN, "success"))
    stub.on("GET", f"{HOLDER_DAG}/dagRuns/{HOLDER_RUN}/taskInstances/pcluster_create/xcomEntries/return_value",
            (200, {"key": "return_value", "value": {"cluster_name": "uc-sweep-s1", "cluster_status": "CREATE_COMPLETE"}}))


def test_a_sweep_on_one_cluster_starts_its_holder_first_and_no_network(stub, capsys):
    """--cluster shared: trn1_sweep_cluster with the sweep's conf, marked shared; once its cluster is
    up, the points with the same conf (each finds the cluster from it); no trn1_sweep_network."""
    holder_routes(stub)
    ids = [f"manual__2026-04-15T10:00:0{i}+00:00" for i in range(2)]
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", *(run(run_id, "queued") for run_id in ids))
    for run_id in ids:
        stub.on("GET", f"{DAG}/dagRuns/{run_id}", run(run_id, "success"))
        stub.on("GET", f"{DAG}/dagRuns/{run_id}/taskInstances?limit=100", tis(("train", "success", 5.0)))

    assert cli(stub, "sweep", "--id", "s1", "--nodes", "1,3", "--cluster", "shared", "--param", "max_steps=40",
               "--poll-interval", "0.01") == 0
    posts = [(path, body) for method, path, body in stub.requests if method == "POST" and path.endswith("/dagRuns")]
    sweep = {"id": "s1", "num_nodes": [1, 3], "scaling_mode": "strong", "cluster": "shared"}
    assert posts[0] == (f"{HOLDER_DAG}/dagRuns", {"logical_date": None, "conf": {"max_steps": 40, "sweep": sweep}})
    assert [body["conf"] for _, body in posts[1:]] == [
        {"max_steps": 40, "sweep": {**sweep, "point": {"num_nodes": n}}} for n in (1, 3)]
    assert not any(NET_DAG in path for _, path, _ in stub.requests)
    out = timeless(capsys.readouterr().out)
    assert f"sweep s1: shared cluster: trn1_sweep_cluster run {HOLDER_RUN}\n" in out
    assert "sweep s1: cluster uc-sweep-s1 is up; every point trains on it\n" in out
    assert "  [cluster] delete_cluster         success            Ts\n" in out   # followed to its end
    assert out.endswith("sweep s1: 2/2 runs succeeded\n")


def test_a_shared_cluster_whose_points_cannot_start_is_released_at_once(stub, capsys):
    holder_routes(stub)
    dates = ["2026-04-12T00:00:00Z"]
    backfill_routes(stub, dates)
    stub.on("POST", "/api/v2/backfills", (409, {"detail": "There is already a running backfill"}))
    stub.on("PATCH", f"{HOLDER_DAG}/dagRuns/{HOLDER_RUN}/taskInstances/hold_cluster", (200, {}))
    assert cli(stub, "sweep", "--id", "s1", "--nodes", "4", "--via", "backfill", "--cluster", "shared",
               "--poll-interval", "0.01", now=NOW) == 2
    backfill = next(body for method, path, body in stub.requests if (method, path) == ("POST", "/api/v2/backfills"))
    assert backfill["dag_run_conf"]["sweep"]["cluster"] == "shared"   # every backfilled run finds the cluster
    assert ("PATCH", f"{HOLDER_DAG}/dagRuns/{HOLDER_RUN}/taskInstances/hold_cluster",
            {"new_state": "success"}) in stub.requests
    assert "releasing the cluster" in capsys.readouterr().out


@pytest.mark.parametrize("nodes", ["1,x", "0,2", "2,2", ""])
def test_bad_node_lists(stub, capsys, nodes):
    assert cli(stub, "sweep", "--id", "s1", "--nodes", nodes) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"--nodes {nodes!r}: ")


def test_past_ticks_are_sundays_strictly_before_now():
    sunday = datetime(2026, 4, 12, tzinfo=UTC)
    assert past_ticks(NOW, 3) == [sunday - timedelta(days=14), sunday - timedelta(days=7), sunday]
    # Exactly on a tick: that run is not past yet (Airflow only backfills intervals ended before now).
    assert past_ticks(sunday, 2) == [sunday - timedelta(days=14), sunday - timedelta(days=7)]
    assert past_ticks(sunday + timedelta(microseconds=1), 1) == [sunday]


def test_the_backfill_window_is_what_airflow_plans():
    """Airflow 3.3's own planning (both bounds inclusive, only ended intervals) over a @weekly DAG
    yields exactly the ticks `ultracluster sweep --via backfill` asks for: no more, no fewer."""
    from airflow.models.backfill import _get_info_list
    from airflow.sdk import DAG as SdkDag
    from airflow.sdk.bases.operator import BaseOperator
    from airflow.serialization.serialized_objects import DagSerialization

    with SdkDag("weekly", schedule="@weekly", catchup=False) as dag:
        BaseOperator(task_id="t")
    serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    ticks = past_ticks(datetime.now(UTC), 4)
    planned = [info.logical_date for info in _get_info_list(from_date=ticks[0], to_date=ticks[-1], reverse=False,
                                                              dag=serialized)]
    assert planned == ticks
