"""The scaling report: cost arithmetic, run records, rows and efficiency (checked by hand), the
renderers, and the build_report task against the real moto S3 server (state and XCom lookups injected)."""
from __future__ import annotations

import base64
import io
import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

from tests.integration.test_dataset import aws_conn, empty_bucket, moto_endpoint  # noqa: F401 - fixtures
from tests.integration.test_results import OutletEvents
from ultracluster.operators.scaling_report import ScalingReportOperator, requested_sweeps
from ultracluster.report.plot import DPI, SIZE_INCHES, plot_png
from ultracluster.report.records import run_record
from ultracluster.report.render import render_html, render_markdown, report_json
from ultracluster.report.table import build_rows, make_report
from ultracluster.run.cost import PriceError, estimate, load_prices, run_cost

PRICES = load_prices()
PRODUCTION_PLAN = {"instance_type": "trn1.32xlarge", "num_nodes": 16, "scaling_mode": "strong", "batch_size": 16,
                   "grad_accum_usteps": 32, "steps_this_run": 28125, "max_steps": 28125,
                   "head_node_instance_type": "c5.4xlarge", "fsx_storage_capacity_gib": 1200}


# --------------------------------------------------------------------------------------------- cost
def test_estimate_by_hand():
    cost = estimate(PRODUCTION_PLAN, PRICES)
    # Strong scaling: 32 accumulation micro-steps over 16 nodes -> 2; 16 x 32 workers.
    assert cost["world_size"] == 512 and cost["global_batch"] == 16 * 2 * 512 == 16384
    assert cost["reference_seq_per_s"] == 3588.0 * 16 == 57408
    hours = 28125 * 16384 / 57408 / 3600 + 0.5
    assert cost["hours"] == pytest.approx(hours, abs=1e-4) and cost["node_hours"] == pytest.approx(16 * hours, abs=1e-4)
    assert cost["head_node_usd"] == round(hours * 0.68, 2) == 1.86
    assert cost["fsx_usd"] == round(1200 * 0.14 * hours / 730, 2) == 0.63
    assert cost["usd"] == round(16 * hours * 21.50 + hours * 0.68 + 1200 * 0.14 * hours / 730, 2) == 941.49
    assert cost["instance_type"] == "trn1.32xlarge" and cost["usd_per_node_hour"] == 21.50


def test_the_budget_guard_projects_spent_plus_remaining():
    from datetime import datetime, timedelta, timezone

    from ultracluster.run.cost import budget_verdict

    now = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
    budget = {"max_usd": 1000.0, "usd_per_hour": 344.0, "since": (now - timedelta(hours=2)).isoformat()}
    assert budget_verdict(budget, eta_s=1800, now=now) is None  # $688 spent + $172 to finish
    verdict = budget_verdict(budget, eta_s=3600 + 360, now=now)  # $688 spent + $378.40 to finish
    assert verdict == ("budget guard: projected cost $1066.40 ($688.00 spent since "
                       f"{budget['since']}, $378.40 more to finish) exceeds max_cost_usd $1000.00")
    assert estimate(PRODUCTION_PLAN, PRICES)["usd_per_hour"] == pytest.approx(
        16 * 21.50 + 0.68 + 1200 * 0.14 / 730, abs=0.01)


def test_estimate_weak_scaling_local_world_size_and_overhead():
    plan = {**PRODUCTION_PLAN, "num_nodes": 2, "scaling_mode": "weak", "batch_size": 8, "grad_accum_usteps": 2,
            "steps_this_run": 40, "head_node_instance_type": "c5.xlarge"}
    cost = estimate(plan, PRICES, world_size=2, overhead_hours=0)
    assert cost["global_batch"] == 8 * 2 * 2
    hours = 40 * 32 / (3588 * 2) / 3600
    assert cost["hours"] == pytest.approx(hours, abs=1e-4)
    assert cost["usd"] == round(2 * hours * 21.50 + hours * 0.17 + 1200 * 0.14 * hours / 730, 2)
    assert estimate({**plan, "instance_type": "trn1.2xlarge"}, PRICES)["reference_seq_per_s"] == 3588 / 16 * 2
    with pytest.raises(PriceError, match="p4d"):
        estimate({**plan, "instance_type": "p4d.24xlarge"}, PRICES)
    with pytest.raises(PriceError, match="head node type 'c9.huge'"):
        estimate({**plan, "head_node_instance_type": "c9.huge"}, PRICES)
    bare = estimate({k: v for k, v in plan.items() if "head" not in k and "fsx" not in k}, PRICES, world_size=2)
    assert bare["head_node_usd"] == bare["fsx_usd"] == 0.0 and bare["usd"] == bare["node_usd"]


def test_run_cost_by_hand_and_with_unknowns():
    assert run_cost("trn1.32xlarge", 2.0, "c5.xlarge", 1.45, 1200, PRICES) == {
        "usd": round(2 * 21.50 + 1.45 * 0.17 + 1200 * 0.14 * 1.45 / 730, 2), "node_usd": 43.0,
        "head_node_usd": 0.25, "fsx_usd": 0.33}
    assert run_cost("trn1.32xlarge", 1.0, "m7.huge", None, 1200, PRICES) == {
        "usd": 21.5, "node_usd": 21.5, "head_node_usd": None, "fsx_usd": None}
    assert run_cost("trn1.32xlarge", None, "c5.xlarge", 1.0, 1200, PRICES)["usd"] is None


def test_prices_file_override(tmp_path, monkeypatch):
    custom = {**{k: v for k, v in PRICES.items() if k != "file"}, "instances": {"trn1.32xlarge": {"usd_per_hour": 10}}}
    (tmp_path / "prices.json").write_text(json.dumps(custom))
    monkeypatch.setenv("ULTRACLUSTER_PRICES_FILE", str(tmp_path / "prices.json"))
    assert run_cost("trn1.32xlarge", 2.0, None, None, None, load_prices())["usd"] == 20.0
    (tmp_path / "bad.json").write_text('{"instances": {"x": {}}}')
    with pytest.raises(PriceError, match="usd_per_hour"):
        load_prices(tmp_path / "bad.json")


# ------------------------------------------------------------------------------------------ records
def at(minute: float) -> str:
    hour, rest = divmod(int(minute), 60)
    return f"2026-11-30T{10 + hour:02d}:{rest:02d}:00+00:00"


def run(nodes, state="success", *, mode="strong", avg=None, ttt=None, extrapolated=False, node_hours=None,
        written=0, train_min=60, points=(1, 2, 4, 8), model="BERT-large", device="xla:NEURON"):
    """A run's index entry, state and XComs as the pipeline leaves them. Timeline (minutes from
    10:00): created 0, fleet ready 12, train 15 -> 15+train_min, deleted 12 minutes later."""
    point = {"id": "s1", "index": list(points).index(nodes) if nodes in points else 0, "count": len(points),
             "points": list(points), "num_nodes": nodes, "scaling_mode": mode, "chosen_by": "point"}
    plan = {"instance_type": "trn1.32xlarge", "head_node_instance_type": "c5.xlarge", "fsx_storage_capacity_gib": 1200,
            "num_nodes": nodes, "scaling_mode": mode, "sweep_point": point}
    entry = {"dag_id": "trn1_bert_pretrain", "run_id": f"manual__{nodes}n_{written}", "point": point, "plan": plan,
             "estimate": {"usd": 1.0}, "written_at": at(written)}
    end = 15 + train_min
    xcoms = {"preflight": {"plan": plan, "estimate": {"usd": 1.0}}, "pcluster_create": {"created_at": at(0)},
             "wait_for_fleet": {"ready_at": at(12)}, "train": {"started_at": at(15), "ended_at": at(end), "steps": 40},
             "delete_cluster": {"deleted_at": at(end + 12)}}
    if avg is not None:
        xcoms["collect_results"] = {
            "average_throughput_seq_per_s": avg, "peak_throughput_seq_per_s": avg * 1.1, "time_to_train_min": ttt,
            "time_to_train_extrapolated": extrapolated, "final_loss": 7.5, "nodes": nodes, "world_size": 32 * nodes,
            "global_batch": 16384, "sweep": point, "node_hours": node_hours, "model": model, "device": device}
    if state == "failed":
        xcoms = {k: v for k, v in xcoms.items() if k in ("preflight", "pcluster_create", "delete_cluster")}
    return entry, state, xcoms


def records(*runs):
    return [run_record(*r) for r in runs]


def test_run_record_maps_the_xcoms_and_tolerates_missing_ones():
    record = run_record(*run(2, avg=1800.0, ttt=55.0, node_hours=2.5))
    assert record["state"] == "success" and record["nodes"] == 2 and record["point"]["id"] == "s1"
    assert record["cluster_created_at"] == at(0) and record["fleet_ready_at"] == at(12)
    assert record["train_started_at"] == at(15) and record["train_ended_at"] == at(75) and record["steps"] == 40
    assert record["cluster_deleted_at"] == at(87) and record["node_hours"] == 2.5
    assert record["instance_type"] == "trn1.32xlarge" and record["head_node_instance_type"] == "c5.xlarge"
    entry, _, _ = run(4)
    bare = run_record(entry, None, {"train": [], "collect_results": None, "pcluster_create": {"created_at": "junk"}})
    assert bare["state"] == "missing" and bare["nodes"] == 4 and bare["cluster_created_at"] is None
    assert bare["average_throughput_seq_per_s"] is None and bare["cost_usd"] is None


# --------------------------------------------------------------------------------------------- rows
def test_the_cost_is_what_ec2_billed_when_delete_cluster_measured_it():
    entry, state, xcoms = run(2, avg=1818.0, ttt=55.0)
    usage = {"basis": "ec2_instances", "usd": 99.99, "compute_usd": 90.3, "head_node_usd": 0.25, "fsx_usd": 9.44,
             "compute_node_hours": 4.2, "head_node_hours": 1.45}
    xcoms["delete_cluster"] = {**xcoms["delete_cluster"], "usage": usage}
    row = build_rows([2], records((entry, state, xcoms)), PRICES)[0]
    assert (row["cost_basis"], row["cost_usd"], row["node_hours"]) == ("ec2_instances", 99.99, 4.2)
    assert row["cost"] == {"usd": 99.99, "node_usd": 90.3, "head_node_usd": 0.25, "fsx_usd": 9.44}


def test_strong_scaling_rows_keep_failed_and_missing_points():
    rows = build_rows([1, 2, 4, 8], records(
        run(1, avg=1000.0, ttt=100.0, node_hours=1.5),
        run(2, avg=1818.0, ttt=55.0, extrapolated=True),
        run(4, "failed")), PRICES)
    assert [(r["nodes"], r["status"]) for r in rows] == [(1, "success"), (2, "success"), (4, "failed"), (8, "missing")]
    assert rows[0]["efficiency"] == 1.0
    assert rows[1]["efficiency"] == pytest.approx(100 * 1 / (55 * 2))  # T1*N1 / (TN*N) = 0.909
    assert rows[2]["efficiency"] is None and rows[3]["efficiency"] is None
    # Wall times: created 10:00 -> deleted 11:27; idle = fleet ready -> train start + train end -> deleted.
    assert rows[0]["cluster_wall_min"] == 87 and rows[0]["idle_fleet_min"] == 3 + 12
    # Cost from the run's node hours; head node and FSx for the cluster's 87 minutes.
    assert rows[0]["cost_basis"] == "node_hours"
    assert rows[0]["cost_usd"] == round(1.5 * 21.50 + 1.45 * 0.17 + 1200 * 0.14 * 1.45 / 730, 2)
    # No node hours: nodes x (fleet ready 10:12 -> train end 11:15) = 2 x 1.05 h.
    assert rows[1]["cost_basis"] == "wall_times" and rows[1]["node_hours"] == pytest.approx(2.1)
    assert rows[1]["cost_usd"] == round(2.1 * 21.50 + 1.45 * 0.17 + 1200 * 0.14 * 1.45 / 730, 2)
    assert rows[1]["time_to_train_extrapolated"] is True
    assert rows[3]["run_id"] is None and rows[3]["runs"] == 0


def test_weak_scaling_and_a_repeated_point():
    points = (1, 2, 4)
    rows = build_rows(points, records(
        run(4, "failed", mode="weak", written=1, points=points),
        run(1, mode="weak", avg=1000.0, ttt=50.0, written=2, points=points),
        run(4, mode="weak", avg=3600.0, ttt=60.0, written=3, points=points),
        run(2, mode="weak", avg=1900.0, ttt=52.0, written=4, points=points),
        run(4, "failed", mode="weak", written=5, points=points)), PRICES)
    assert [r["nodes"] for r in rows] == [1, 2, 4]
    assert rows[1]["efficiency"] == pytest.approx(1900 / ((2 / 1) * 1000))  # 0.95
    assert rows[2]["efficiency"] == pytest.approx(3600 / ((4 / 1) * 1000))  # 0.90
    # The latest successful of its three runs, and a note.
    assert rows[2]["status"] == "success" and rows[2]["run_id"] == "manual__4n_3"
    assert rows[2]["notes"] == ["point ran 3 times"] and rows[2]["runs"] == 3


def test_report_pending_references_and_markdown():
    report = make_report("s1", "trn1_bert_pretrain", [1, 2, 4, 8], records(
        run(1, avg=1000.0, ttt=100.0, extrapolated=True), run(2, "running", avg=1818.0, ttt=55.0),
        run(4, "failed")), PRICES, partial=True)
    assert [(p["nodes"], p["status"], p["tearing_down"]) for p in report["pending"]] == [
        (2, "running", True), (8, "missing", False)]
    assert [r["label"] for r in report["references"]] == ["Neuron 2.6 (phase 1)", "Neuron 2.28 (weak scaling)"]
    assert report["baseline_nodes"] == 1 and report["scaling_mode"] == "strong"
    markdown = render_markdown(report)
    lines = markdown.splitlines()
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) == 1 + 4 + 2  # header, 4 points, 2 references
    assert "| 100.0* |" in table[1]  # extrapolated time to train
    assert table[3].endswith("| failed |") and table[4].endswith("| missing |")
    assert "49,846.0" in table[5] and "92.5%" in table[5] and "reference: Neuron 2.6 (phase 1)" in table[5]
    assert "- 8 nodes: missing" in markdown and "tearing down" in markdown and "**Partial**" in markdown


@pytest.fixture(scope="module")
def report():
    return make_report("s1", "trn1_bert_pretrain", [1, 2, 4], records(
        run(1, mode="weak", avg=1000.0, ttt=50.0, points=(1, 2, 4)),
        run(2, mode="weak", avg=1900.0, ttt=52.0, points=(1, 2, 4))), PRICES)


def test_plot_is_a_png_of_the_expected_size(report):
    from PIL import Image

    png = plot_png(report)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG"
        assert image.size == (int(SIZE_INCHES[0] * DPI), int(SIZE_INCHES[1] * DPI))
    empty = plot_png({**report, "rows": [], "references": []})
    assert empty[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_is_self_contained(report):
    png = plot_png(report)
    page = render_html(report, png)
    assert f'src="data:image/png;base64,{base64.b64encode(png).decode()}"' in page
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page
    assert page.count("<tr>") == 1 + 3 + 2 and "95.0%" in page


def test_json_round_trips(report):
    assert json.loads(report_json(report)) == report


# ------------------------------------------------------------------------------- build_report task
BUCKET = "uc-report-test"
ARTIFACTS = f"s3://{BUCKET}/runs"
INDEX = "runs/sweeps/trn1_bert_pretrain/s1/runs"
REPORTS = "runs/reports/trn1_bert_pretrain/s1"


@pytest.fixture
def s3(aws_conn):
    """A boto3 client of the moto server; Airflow connection ``uc_test_aws`` points at it."""
    empty_bucket(aws_conn, BUCKET)
    return aws_conn


class RecordingTaskInstance:
    """Just enough of a TaskInstance for the task's extra link (xcom_push)."""

    def __init__(self):
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def task(s3, runs, *, params=None, events=None, **kwargs):
    """Index ``runs`` in S3, then run build_report with their states and XComs injected."""
    from airflow.sdk import Asset

    for entry, _, _ in runs:
        s3.put_object(Bucket=BUCKET, Key=f"{INDEX}/{entry['run_id']}.json", Body=json.dumps(entry))
    s3.put_object(Bucket=BUCKET, Key=f"{INDEX}/broken.json", Body=b"{not json")
    states = {entry["run_id"]: state for entry, state, _ in runs}
    xcoms = {entry["run_id"]: values for entry, _, values in runs}
    asset = Asset(name="trn1_bert_pretrain_scaling_report")
    op = ScalingReportOperator(task_id="build_report", aws_conn_id="uc_test_aws", outlets=[asset],
                               state_lookup=lambda dag_id, run_id: states.get(run_id),
                               xcom_lookup=lambda ti, dag_id, run_id: xcoms[run_id], **kwargs)
    context = {"params": {"sweep_id": "s1", "partial": False, "source_dag_id": "trn1_bert_pretrain",
                          "artifacts_s3_uri": ARTIFACTS, **(params or {})},
               "ti": RecordingTaskInstance(), "triggering_asset_events": events or {}, "outlet_events": OutletEvents()}
    return op, context, asset


def test_build_report_writes_the_files_and_emits_the_event(s3):
    runs = [run(1, avg=1000.0, ttt=100.0, points=(1, 2)), run(2, avg=1818.0, ttt=55.0, points=(1, 2))]
    op, context, asset = task(s3, runs)
    result = op.execute(context)
    assert result["sweep_id"] == "s1" and result["uri"] == f"s3://{BUCKET}/{REPORTS}/"
    assert [r["nodes"] for r in result["rows"]] == [1, 2]
    assert "| 1 | BERT-large | Trainium (Neuron) | 32 |" in result["markdown"]
    assert context["outlet_events"][asset].extra == {"sweep_id": "s1", "uri": result["uri"]}
    objects = {o["Key"]: o for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=REPORTS)["Contents"]}
    assert sorted(objects) == [f"{REPORTS}/{n}" for n in ("report.html", "report.json", "report.md", "throughput.png")]
    png = s3.get_object(Bucket=BUCKET, Key=f"{REPORTS}/throughput.png")
    assert png["ContentType"] == "image/png" and png["Body"].read()[:4] == b"\x89PNG"
    stored = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{REPORTS}/report.json")["Body"].read())
    assert stored["rows"][1]["efficiency"] == pytest.approx(100 / 110) and len(stored["references"]) == 2
    json.dumps(result)  # a valid XCom
    # The "Sweep Report" link: the plugin's page of this sweep.
    from ultracluster.links import SweepReportLink
    assert context["ti"].xcom[SweepReportLink.key] == {"dag_id": "trn1_bert_pretrain", "sweep_id": "s1"}


def test_build_report_skips_while_a_point_is_pending_unless_partial(s3):
    runs = [run(1, avg=1000.0, ttt=100.0, points=(1, 2, 4)), run(2, "queued", points=(1, 2, 4))]
    op, context, _ = task(s3, runs)
    with pytest.raises(AirflowSkipException, match=r"pending: 2 nodes queued, 4 nodes missing"):
        op.execute(context)
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix=REPORTS)
    op, context, _ = task(s3, runs, params={"partial": True})
    assert [r["status"] for r in op.execute(context)["rows"]] == ["success", "queued", "missing"]


def test_build_report_waits_for_teardowns(s3):
    runs = [run(1, avg=1000.0, ttt=100.0, points=(1, 2)), run(2, "running", avg=1818.0, ttt=55.0, points=(1, 2))]
    op, context, _ = task(s3, runs, poll_interval=5)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    assert deferred.value.method_name == "execute" and "waiting_since" in deferred.value.kwargs
    # Linked before the wait (Airflow formats links when the try defers).
    assert context["ti"].xcom["ultracluster_sweep_report"] == {"dag_id": "trn1_bert_pretrain", "sweep_id": "s1"}
    op, context, _ = task(s3, runs, teardown_wait=0)
    with pytest.raises(AirflowSkipException, match=r"2 nodes running \(tearing down\)"):
        op.execute(context)
    runs[1] = (runs[1][0], "success", runs[1][2])  # the teardown finished: the resumed task reports
    op, context, _ = task(s3, runs)
    assert op.execute(context, event=None, **deferred.value.kwargs)["rows"][1]["status"] == "success"


def shared_point(nodes, usd, node_hours):
    """A point of sweep s1 that trained on its shared cluster: billed from its own Slurm jobs, no teardown."""
    entry, state, xcoms = run(nodes, avg=1000.0 * nodes, ttt=100.0 / nodes, points=(1, 2))
    entry["plan"]["existing_cluster_name"] = "uc-sweep-s1"
    xcoms["pcluster_create"] = {"cluster_name": "uc-sweep-s1", "existing": True}
    xcoms.pop("delete_cluster")
    xcoms["collect_results"]["usage"] = {"basis": "slurm_jobs", "usd": usd, "compute_node_hours": node_hours}
    return entry, state, xcoms


def test_build_report_on_a_shared_cluster_waits_for_the_holders_bill(s3):
    """Both points ended, but the holder has not deleted (and billed) the cluster: the report defers
    as for a teardown, and once the bill is in S3 the Shared cluster line has the overhead; a partial
    report before it says the cluster is not billed yet."""
    runs = [shared_point(1, 2.0, 0.1), shared_point(2, 3.0, 0.15)]
    op, context, _ = task(s3, runs, poll_interval=5)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    assert deferred.value.method_name == "execute"
    op, context, _ = task(s3, runs, teardown_wait=0)
    with pytest.raises(AirflowSkipException, match="shared cluster uc-sweep-s1 not billed yet"):
        op.execute(context)
    op, context, _ = task(s3, runs, params={"partial": True})
    shared_line = next(line for line in op.execute(context)["markdown"].splitlines()
                       if line.startswith("| Shared cluster |"))
    assert "uc-sweep-s1: not billed yet" in shared_line
    bill = {"basis": "ec2_instances", "usd": 9.0, "head_node_usd": 1.0, "fsx_usd": 1.5, "compute_usd": 6.5,
            "compute_node_hours": 0.4}
    s3.put_object(Bucket=BUCKET, Key="runs/sweeps/trn1_bert_pretrain/s1/shared-cluster/usage.json",
                  Body=json.dumps(bill))
    op, context, _ = task(s3, runs)
    report = op.execute(context, event=None, **deferred.value.kwargs)
    assert [(r["nodes"], r["cost_usd"]) for r in report["rows"]] == [(1, 2.0), (2, 3.0)]
    shared_line = next(line for line in report["markdown"].splitlines() if line.startswith("| Shared cluster |"))
    # head 1.00 + FSx 1.50 + idle nodes (6.50 - 5.00 the points' jobs) = 4.00; 0.4 - 0.25 idle node-hours
    assert "| 4.00 |" in shared_line and "idle nodes 1.50 (0.150 node-h)" in shared_line, shared_line


def test_build_report_without_a_sweep_skips(s3):
    events = {"results": [SimpleNamespace(extra={"sweep": None})]}
    op, context, _ = task(s3, [], params={"sweep_id": None}, events=events)
    with pytest.raises(AirflowSkipException, match="No sweep to report"):
        op.execute(context)


def test_only_a_missing_run_reads_as_no_state(monkeypatch):
    from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
    from airflow.sdk.execution_time.comms import ErrorResponse
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from ultracluster.hooks.dag_runs import get_dagrun_state as dagrun_state

    def failing(status):
        def get_dagrun_state(dag_id, run_id):
            raise AirflowRuntimeError(ErrorResponse(error=ErrorType.API_SERVER_ERROR, detail={"status_code": status}))
        return get_dagrun_state

    monkeypatch.setattr(RuntimeTaskInstance, "get_dagrun_state", staticmethod(failing(404)))
    assert dagrun_state("d", "r") is None
    monkeypatch.setattr(RuntimeTaskInstance, "get_dagrun_state", staticmethod(failing(503)))
    with pytest.raises(AirflowRuntimeError):
        dagrun_state("d", "r")


def test_sweeps_come_from_the_param_or_the_events():
    event = SimpleNamespace(extra={"sweep": {"id": "s2"},
                                   "artifacts_uri": "s3://other-bucket/p/results/trn1_bert_pretrain/run-1a2b/"})
    events = {"results": [event, SimpleNamespace(extra={"sweep": None}),
                          SimpleNamespace(extra={"sweep": {"id": "s3"}})]}
    assert requested_sweeps({"sweep_id": None}, events) == {"s2": "s3://other-bucket/p", "s3": None}
    assert requested_sweeps({"sweep_id": "s1"}, events) == {"s1": None}


def test_a_run_summary_has_the_report_row_numbers_and_the_ec2_bill():
    from ultracluster.report.summary import run_summary, summary_lines

    _, state, xcoms = run(2, avg=1818.0, ttt=55.0, extrapolated=True)
    xcoms["delete_cluster"] = {**xcoms["delete_cluster"], "usage": {
        "usd": 99.99, "compute_usd": 90.3, "head_node_usd": 0.25, "fsx_usd": 9.44, "instance_hours": 5.65,
        "compute_node_hours": 4.2, "head_node_hours": 1.45, "instances": 3}}
    summary = run_summary(state, xcoms, PRICES)
    # Timeline of run(): created 0, ready 12, train 15 -> 75, deleted 87 (minutes).
    assert (summary["nodes"], summary["cluster_wall_min"], summary["idle_fleet_min"]) == (2, 87, 3 + 12)
    assert (summary["cost_usd"], summary["cost_basis"], summary["instance_hours"]) == (99.99, "ec2_instances", 5.65)
    lines = dict(summary_lines(summary))
    assert lines["cost"].startswith("$99.99 from EC2 instance lives (compute $90.30, head node $0.25, FSx $9.44)")
    assert lines["idle fleet"] == "15.00 min (fleet ready to train 3.00, train end to delete 12.00)"
    assert lines["time to train"] == "55.00 (extrapolated) min"
    assert "3 instances" in lines["instance-hours"] and lines["cost"].endswith("preflight estimated $1.00")
