"""The plugin's pages (ultracluster/ui) with FastAPI's TestClient: Airflow's real SimpleAuthManager and
security dependencies, the session's moto S3 server holding a report written by the real
build_report task, and a throwaway SQLite metadata DB (Airflow's own models, created with
create_all) for the permission lookups and the Slurm job page. A real API server: tests/e2e/test_ui_reports.py."""
from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pendulum
import pytest

from tests.integration.test_dataset import empty_bucket, moto_endpoint  # noqa: F401 - fixture
from tests.integration.test_report import run
from tests.integration.test_results import OutletEvents
from ultracluster.operators.scaling_report import ScalingReportOperator

BUCKET = "uc-ui-test"
ARTIFACTS = f"s3://{BUCKET}/runs"
DAG_ID = "trn1_bert_pretrain"
ROUTES = {"/reports", "/reports/{dag_id}/{sweep_id}", "/reports/{dag_id}/{sweep_id}/plot.png",
          "/jobs/{dag_id}/{run_id}/{task_id}"}
SAMPLE_PATHS = ["/ultracluster/reports", f"/ultracluster/reports/{DAG_ID}/s1",
                f"/ultracluster/reports/{DAG_ID}/s1/plot.png", f"/ultracluster/jobs/{DAG_ID}/manual__1/train"]
JWT_SECRET = "ultracluster-ui-unit-test-secret-" + "x" * 40


@pytest.fixture(scope="module")
def metadata_db(tmp_path_factory):
    """Airflow's metadata tables in a SQLite file, behind airflow.settings' sessions (what
    provide_session, SessionDep and DagModel.get_team_name use)."""
    from airflow import settings
    from airflow.models import import_all_models
    from airflow.models.base import Base
    from sqlalchemy import create_engine
    from sqlalchemy.orm import scoped_session, sessionmaker

    import_all_models()
    engine = create_engine(f"sqlite:///{tmp_path_factory.mktemp('airflow-db') / 'airflow.db'}")
    Base.metadata.create_all(engine)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "Session", scoped_session(factory))
        patch.setattr(settings, "NonScopedSession", factory)
        yield factory
    engine.dispose()


@pytest.fixture
def auth(monkeypatch, tmp_path):
    """Airflow's SimpleAuthManager as the API server initialises it; tokens as POST /auth/token makes them."""
    from airflow.api_fastapi import app as api_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                       "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "passwords.json"))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", JWT_SECRET)
    monkeypatch.setattr(api_app._AuthManagerState, "instance", None)
    manager = api_app.init_auth_manager()
    return SimpleNamespace(manager=manager, token=lambda name, role: manager.generate_jwt(
        SimpleAuthManagerUser(username=name, role=role)))


@pytest.fixture
def s3(moto_endpoint, monkeypatch):  # noqa: F811
    """The deployment's defaults: aws_default points at moto, the profile names the artifacts prefix."""
    import boto3

    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}}))
    monkeypatch.setenv("ULTRACLUSTER_PROFILE", "production")
    monkeypatch.setenv("ULTRACLUSTER_ARTIFACTS_S3_URI", ARTIFACTS)
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    empty_bucket(client, BUCKET)
    return client


@pytest.fixture
def client(auth, metadata_db, s3):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from ultracluster.ui.app import create_app

    root = FastAPI()
    app = create_app()
    root.mount("/ultracluster", app)
    return SimpleNamespace(http=TestClient(root), app=app, auth=auth, db=metadata_db,
                           admin={"Authorization": f"Bearer {auth.token('admin', 'admin')}"})


def write_report(s3, sweep_id="s1"):
    """A 2-point weak-scaling sweep reported by the real build_report task (states and XComs injected)."""
    runs = [run(1, mode="weak", avg=1000.0, ttt=100.0, points=(1, 2)),
            run(2, mode="weak", avg=1900.0, ttt=55.0, points=(1, 2), written=1)]
    for entry, _, _ in runs:
        s3.put_object(Bucket=BUCKET, Key=f"runs/sweeps/{DAG_ID}/{sweep_id}/runs/{entry['run_id']}.json",
                      Body=json.dumps(entry))
    states = {entry["run_id"]: state for entry, state, _ in runs}
    xcoms = {entry["run_id"]: values for entry, _, values in runs}
    op = ScalingReportOperator(task_id="build_report", aws_conn_id="aws_default",
                               state_lookup=lambda dag_id, run_id: states[run_id],
                               xcom_lookup=lambda ti, dag_id, run_id: xcoms[run_id])
    return op.execute({"params": {"sweep_id": sweep_id, "partial": False, "source_dag_id": DAG_ID,
                                  "artifacts_s3_uri": ARTIFACTS},
                       "ti": SimpleNamespace(xcom_push=lambda key, value: None),  # the Sweep Report link
                       "triggering_asset_events": {}, "outlet_events": OutletEvents()})


# ------------------------------------------------------------------------------------------- auth
def test_every_route_refuses_a_request_without_airflows_authentication(client):
    from fastapi.routing import APIRoute
    from fastapi.testclient import TestClient

    # Only these routes, all of them API routes (no /docs or /openapi.json, which skip dependencies).
    assert all(isinstance(r, APIRoute) for r in client.app.routes)
    assert {r.path for r in client.app.routes} == ROUTES
    expired = client.auth.manager.generate_jwt(client.auth.manager.deserialize_user(
        {"sub": "admin", "role": "admin"}), expiration_time_in_seconds=-60)
    for path in SAMPLE_PATHS:
        anonymous = client.http.get(path)
        assert anonymous.status_code == 401, (path, anonymous.text)
        assert "Sign in" in anonymous.text and "text/html" in anonymous.headers["content-type"]
        assert client.http.get(path, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
        assert TestClient(client.http.app, cookies={"_token": "not-a-jwt"}).get(path).status_code == 403
        assert client.http.get(path, headers={"Authorization": f"Bearer {expired}"}).status_code == 401
        # Bad ids, anonymously: refused before they are even validated.
        assert client.http.get(path.replace("s1", "Not a sweep")).status_code == 401


def test_a_bearer_token_and_the_uis_cookie_both_authenticate(client, s3):
    write_report(s3)
    by_header = client.http.get("/ultracluster/reports", headers=client.admin)
    from fastapi.testclient import TestClient

    browser = TestClient(client.http.app, cookies={"_token": client.auth.token("viewer", "viewer")})
    by_cookie = browser.get("/ultracluster/reports")
    assert by_header.status_code == by_cookie.status_code == 200, (by_header.text, by_cookie.text)
    assert by_header.text == by_cookie.text and 'href="reports/trn1_bert_pretrain/s1"' in by_cookie.text


def test_a_dag_the_user_may_not_read_is_neither_listed_nor_shown(client, s3, monkeypatch):
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    write_report(s3)
    s3.put_object(Bucket=BUCKET, Key="runs/reports/other_dag/s2/report.json", Body=json.dumps({"rows": []}))
    listed = client.http.get("/ultracluster/reports", headers=client.admin).text
    assert "reports/other_dag/s2" in listed and "reports/trn1_bert_pretrain/s1" in listed
    asked = []
    original = SimpleAuthManager.is_authorized_dag

    def only_other_dag(self, *, method, user, access_entity=None, details=None):
        asked.append((method, access_entity, details.id))
        return details.id == "other_dag" and original(self, method=method, user=user, access_entity=access_entity,
                                                      details=details)

    monkeypatch.setattr(SimpleAuthManager, "is_authorized_dag", only_other_dag)
    listed = client.http.get("/ultracluster/reports", headers=client.admin).text
    assert "reports/other_dag/s2" in listed and "trn1_bert_pretrain" not in listed
    for path in SAMPLE_PATHS[1:]:
        assert client.http.get(path, headers=client.admin).status_code == 403, path
    assert ("GET", "RUN", DAG_ID) in {(m, e.name, d) for m, e, d in asked}


# ---------------------------------------------------------------------------------------- reports
def test_the_list_links_each_reported_sweep(client, s3):
    assert "No report yet" in client.http.get("/ultracluster/reports", headers=client.admin).text
    write_report(s3)
    write_report(s3, "s2-later")
    s3.put_object(Bucket=BUCKET, Key="runs/reports/trn1_bert_pretrain/Bad Id/report.json", Body=b"{}")
    page = client.http.get("/ultracluster/reports", headers=client.admin)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    text = page.text
    assert text.index('href="reports/trn1_bert_pretrain/s2-later"') < text.index('href="reports/trn1_bert_pretrain/s1"')
    assert "Bad Id" not in text  # not a sweep id: never listed, never read
    assert f"{ARTIFACTS}/reports/" in text and "<td class=\"text\">weak</td>" in text and "2 of 2" in text
    assert "<script" not in text


def test_the_report_page_shows_the_table_and_the_plot(client, s3):
    result = write_report(s3)
    page = client.http.get(f"/ultracluster/reports/{DAG_ID}/s1", headers=client.admin)
    assert page.status_code == 200, page.text
    text = page.text
    assert 'src="s1/plot.png"' in text and 'href="../../reports"' in text
    # The table: a header row, one row per point, then the reference points (trn1.32xlarge).
    assert text.count("<tr>") == 1 + 2 + 2 and "<th>Avg seq/s</th>" in text and "<td>1,900.0</td>" in text
    run_id = result["rows"][1]["run_id"]
    assert f'href="../../../dags/{DAG_ID}/runs/{run_id}" target="_top"' in text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    plot = client.http.get(f"/ultracluster/reports/{DAG_ID}/s1/plot.png", headers=client.admin)
    stored = s3.get_object(Bucket=BUCKET, Key=f"runs/reports/{DAG_ID}/s1/throughput.png")["Body"].read()
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/png" and plot.content == stored
    assert stored.startswith(b"\x89PNG")


def test_report_values_are_escaped(client, s3):
    write_report(s3)
    key = f"runs/reports/{DAG_ID}/s1/report.json"
    report = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    report["title"] = "<script>alert(1)</script>"
    report["rows"][0]["status"] = '"><img src=x onerror=alert(1)>'
    report["notes"] = ["<b>bold</b>"]
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(report))
    text = client.http.get(f"/ultracluster/reports/{DAG_ID}/s1", headers=client.admin).text
    assert "<script>" not in text and "<img src=x" not in text and "<b>bold" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&lt;b&gt;bold&lt;/b&gt;" in text


@pytest.mark.parametrize("path", [
    f"/ultracluster/reports/{DAG_ID}/Bad%20Id", f"/ultracluster/reports/{DAG_ID}/..%2Fsweeps",
    "/ultracluster/reports/.hidden/s1", f"/ultracluster/reports/{DAG_ID}/s1%3Cx%3E/plot.png",
    f"/ultracluster/jobs/{DAG_ID}/run%2Fx/train", f"/ultracluster/jobs/{DAG_ID}/manual__1/tr%20ain",
])
def test_ids_are_checked_before_any_key_or_query(client, path):
    answer = client.http.get(path, headers=client.admin)
    assert answer.status_code in (404, 422), (path, answer.status_code, answer.text)


def test_a_missing_report_or_an_unreachable_bucket(client, s3, monkeypatch):
    assert client.http.get(f"/ultracluster/reports/{DAG_ID}/nope", headers=client.admin).status_code == 404
    assert client.http.get(f"/ultracluster/reports/{DAG_ID}/nope/plot.png", headers=client.admin).status_code == 404
    s3.put_object(Bucket=BUCKET, Key=f"runs/reports/{DAG_ID}/odd/report.json", Body=json.dumps({"rows": [{}]}))
    odd = client.http.get(f"/ultracluster/reports/{DAG_ID}/odd", headers=client.admin)
    assert odd.status_code == 502 and "lacks what the page shows" in odd.text
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
                  "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}}))
    down = client.http.get("/ultracluster/reports", headers=client.admin)
    assert down.status_code == 502 and "cannot list s3://uc-ui-test/runs/reports/" in down.text


# ------------------------------------------------------------------------------------- Slurm job
def add_task(db, run_id, task_id, state, xcoms):
    """A run, one task instance and its XComs, as the scheduler and the task runner leave them."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.types import DagRunType

    with DAG(DAG_ID, schedule=None) as dag:
        EmptyOperator(task_id=task_id)
    task = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).get_task(task_id)
    now = pendulum.now("UTC")
    with db() as session, session.begin():
        dag_run = DagRun(dag_id=DAG_ID, run_id=run_id, run_type=DagRunType.MANUAL, logical_date=now, run_after=now,
                         state="running")
        session.add(dag_run)
        session.flush()
        session.add(TaskInstance(task, dag_version_id=uuid.uuid4(), run_id=run_id, state=state))
        for (xcom_task, key), value in xcoms.items():
            session.add(XComModel(dag_run_id=dag_run.id, run_id=run_id, dag_id=DAG_ID, task_id=xcom_task, map_index=-1,
                                  key=key, value=json.dumps(value), timestamp=now))


HEAD = {"cluster_name": "uc-abc123", "address": "127.100.7.1", "host_key": "ssh-ed25519 AAAA", "partition": "train"}
SUBMITTED = {"job_id": "41", "log_path": "/fsx/jobs/run/slurm-41.out"}


def test_the_job_page_while_the_job_runs_and_once_it_ended(client):
    from ultracluster.ui.jobs import SLURM_JOB_KEY

    add_task(client.db, "manual__running", "train", "deferred",
             {("train", SLURM_JOB_KEY): SUBMITTED, ("wait_for_fleet", "return_value"): HEAD})
    page = client.http.get(f"/ultracluster/jobs/{DAG_ID}/manual__running/train", headers=client.admin)
    assert page.status_code == 200, page.text
    assert '<dd id="slurm-job-id">41</dd>' in page.text and '<dd id="slurm-job-state">not ended</dd>' in page.text
    assert '<dd id="log-on-the-head-node">/fsx/jobs/run/slurm-41.out</dd>' in page.text
    assert '<dd id="head-node">uc-abc123 (127.100.7.1)</dd>' in page.text and "Task deferred" in page.text

    run_id = "manual__2026-12-01T06:59:43.056935+00:00"  # a real run id: ':' and '+' in the path
    done = {**SUBMITTED, "state": "COMPLETED", "exit_code": 0, "output_dir": "/fsx/jobs/run/output_41",
            "results_path": "/fsx/jobs/run/output_41/results.json"}
    add_task(client.db, run_id, "parallel_compile", "success",
             {("parallel_compile", SLURM_JOB_KEY): SUBMITTED, ("parallel_compile", "return_value"): done})
    page = client.http.get(f"/ultracluster/jobs/{DAG_ID}/{run_id.replace('+', '%2B')}/parallel_compile",
                           headers=client.admin)
    assert page.status_code == 200, page.text
    assert '<dd id="slurm-job-state">COMPLETED</dd>' in page.text and '<dd id="exit-code">0</dd>' in page.text
    assert '<dd id="task-state">success</dd>' in page.text and '<dd id="head-node">-</dd>' in page.text
    assert 'href="../../../../dags/trn1_bert_pretrain/runs/manual__2026-12-01T06%3A59%3A43.056935%2B00%3A00/tasks/' \
           'parallel_compile" target="_top"' in page.text

    assert client.http.get(f"/ultracluster/jobs/{DAG_ID}/manual__running/nope", headers=client.admin).status_code == 404
    assert client.http.get(f"/ultracluster/jobs/{DAG_ID}/manual__running/train").status_code == 401


def test_job_facts_of_failed_tasks_and_of_one_not_yet_submitted():
    from ultracluster.ui.jobs import facts_of

    # The job's end as the link's XCom has it (pushed again with the state when the trigger saw the end).
    ended = {**SUBMITTED, "cluster_name": "uc-abc123", "state": "TIMEOUT"}
    timed_out = facts_of(DAG_ID, "r", "train", "failed", 1, submitted=ended, result=None, head_node=None)
    assert (timed_out["job_id"], timed_out["job_state"], timed_out["head_node"]) == ("41", "TIMEOUT", "uc-abc123")
    assert timed_out["job_state_note"] is None
    # A worker died before the end was recorded.
    failed = facts_of(DAG_ID, "r", "train", "failed", 2, submitted=SUBMITTED, result=None, head_node=HEAD)
    assert failed["job_id"] == "41" and failed["job_state"] == "ended, task failed" and failed["try_number"] == 2
    assert failed["log_path"] == SUBMITTED["log_path"] and "its log has Slurm's final state" in failed["job_state_note"]
    assert failed["head_node"] == "uc-abc123 (127.100.7.1)"
    waiting = facts_of(DAG_ID, "r", "train", "scheduled", 0, submitted=None, result=None, head_node=None)
    assert waiting["job_id"] is None and waiting["job_state"] is None and waiting["log_path"] is None


# ------------------------------------------------------------------------------------------ plugin
def test_the_plugin_registers_the_app_and_the_nav_entry():
    from importlib.metadata import entry_points

    from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
    from fastapi import FastAPI

    from ultracluster.ui.plugin import UltraClusterPlugin

    [entry] = [e for e in entry_points(group="airflow.plugins") if e.value.startswith("ultracluster.")]
    assert entry.load() is UltraClusterPlugin
    plugin = UltraClusterPlugin()
    [mounted] = plugin.fastapi_apps
    assert isinstance(mounted["app"], FastAPI) and mounted["url_prefix"] == "/ultracluster"
    assert not any(mounted["url_prefix"].startswith(p) for p in RESERVED_URL_PREFIXES)
    [view] = plugin.external_views
    # Relative to the UI's <base href>: no leading slash, under the app's prefix.
    assert view["href"] == "ultracluster/reports" and view["destination"] == "nav"
    assert view["category"] == "browse" and view["name"] == "Scaling reports"
