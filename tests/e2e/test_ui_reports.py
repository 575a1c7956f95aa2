"""The ultracluster plugin in a real API server (the session's ``airflow_local``, started by
scripts/airflow.sh with the package installed, so the plugin comes from its entry point) and in Chromium:
the nav's "Scaling reports" lists a sweep and shows its report with the plot loaded; the Slurm job
page shows a train task's job; every plugin route refuses a request without Airflow's authentication.

The report: test_sweep.py's (e2e-backfill) when it ran earlier in the session; alone, one written by
the real build_report task from synthetic runs into the same artifacts bucket (no training). The job:
a train task that ran in the session (test_ui_browser.py's or test_sweep.py's runs); alone, a queued
run of the paused pipeline whose train XComs are set through the REST API, then deleted.
The report page's screenshot, in 256 colours, is the README's: out/browser/scaling-reports-readme.png,
copied to docs/img/scaling-reports.png by hand (as graph.png: a test run leaves docs/ alone).
"""
from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from types import SimpleNamespace
from urllib.parse import quote

import pytest

from tests.e2e.conftest import DAG_ID, RUNTIME_READY, s3_client
from tests.e2e.test_ui_browser import SHOTS, browser, logged_in_page  # noqa: F401 - fixture
from tests.fixtures_localcluster import FAKE_AWS

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

BUCKET = "ultracluster-artifacts"
ARTIFACTS = f"s3://{BUCKET}/runs"  # the local profile's artifacts_s3_uri
REPORTS = f"runs/reports/{DAG_ID}/"
SWEEP_SWEEP = "e2e-backfill"  # test_sweep.py's backfilled sweep
ALONE_SWEEP = "ui-reports"
README_SHOT = SHOTS / "scaling-reports-readme.png"  # docs/img/scaling-reports.png
SLURM_JOB_KEY = "ultracluster_slurm_job"


def get(api, path: str, *, token: str | None = None, cookie: str | None = None) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, with the given credentials only."""
    req = urllib.request.Request(api.base + path)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if cookie is not None:
        req.add_header("Cookie", f"_token={cookie}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def reported_sweeps(s3) -> list[str]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=REPORTS).get("Contents", [])]
    return [k[len(REPORTS):].split("/")[0] for k in keys if k.endswith("/report.json")]


def write_alone_report(env: dict[str, str]) -> None:
    """The real build_report task, in this process, on two synthetic runs (tests/unit/test_report.py's)."""
    from tests.integration.test_report import run
    from tests.integration.test_results import OutletEvents
    from ultracluster.operators.scaling_report import ScalingReportOperator

    runs = [run(1, mode="weak", avg=60.0, ttt=2.0, points=(1, 2)),
            run(2, mode="weak", avg=110.0, ttt=1.1, points=(1, 2), written=1)]
    s3 = s3_client(env["AWS_ENDPOINT_URL"])
    for entry, _, _ in runs:
        s3.put_object(Bucket=BUCKET, Key=f"runs/sweeps/{DAG_ID}/{ALONE_SWEEP}/runs/{entry['run_id']}.json",
                      Body=json.dumps(entry))
    states = {entry["run_id"]: state for entry, state, _ in runs}
    xcoms = {entry["run_id"]: values for entry, _, values in runs}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_UC_E2E_AWS", json.dumps({
            "conn_type": "aws", "login": FAKE_AWS["AWS_ACCESS_KEY_ID"],
            "password": FAKE_AWS["AWS_SECRET_ACCESS_KEY"],
            "extra": {"endpoint_url": env["AWS_ENDPOINT_URL"], "region_name": "us-east-1"}}))
        ScalingReportOperator(task_id="build_report", aws_conn_id="uc_e2e_aws",
                              state_lookup=lambda dag_id, run_id: states[run_id],
                              xcom_lookup=lambda ti, dag_id, run_id: xcoms[run_id]).execute({
            "params": {"sweep_id": ALONE_SWEEP, "partial": False, "source_dag_id": DAG_ID,
                       "artifacts_s3_uri": ARTIFACTS},
            "ti": SimpleNamespace(xcom_push=lambda key, value: None),  # the Sweep Report link
            "triggering_asset_events": {}, "outlet_events": OutletEvents()})


@pytest.fixture(scope="module")
def sweep_report(airflow_local) -> str:
    """The id of a reported sweep of the pipeline in the session's artifacts bucket."""
    _, env = airflow_local
    s3 = s3_client(env["AWS_ENDPOINT_URL"])
    sweeps = reported_sweeps(s3)
    if SWEEP_SWEEP in sweeps:
        return SWEEP_SWEEP
    write_alone_report(env)
    assert ALONE_SWEEP in reported_sweeps(s3)
    return ALONE_SWEEP


def finished_train(api) -> tuple[str, dict] | None:
    """A run of the session whose train task succeeded, and train's return value."""
    runs = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?state=success&limit=100")["dag_runs"]
    for run in runs:
        if api.task_states(DAG_ID, run["dag_run_id"]).get("train") == "success":
            xcom = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'], safe='')}"
                                   "/taskInstances/train/xcomEntries/return_value")
            return run["dag_run_id"], xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    return None


@pytest.fixture(scope="module")
def train_job(airflow_local):
    """(run id, train's job as its return value has it) of a train task in this Airflow."""
    api, _ = airflow_local
    found = finished_train(api)
    if found:
        yield found
        return
    # Alone: a run of the paused pipeline stays queued; its train XComs are set as the task would set them.
    dag = api.call("GET", f"/api/v2/dags/{DAG_ID}")
    api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": True})
    run_id = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {}})["dag_run_id"]
    job = {"job_id": "4242", "state": "COMPLETED", "exit_code": 0, "log_path": "/fsx/jobs/x/slurm-4242.out",
           "output_dir": "/fsx/jobs/x/output_4242", "results_path": "/fsx/jobs/x/output_4242/results.json"}
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances"
    try:
        api.call("POST", f"{path}/train/xcomEntries", {"key": SLURM_JOB_KEY, "value": {
            "job_id": job["job_id"], "log_path": job["log_path"]}})
        api.call("POST", f"{path}/train/xcomEntries", {"key": "return_value", "value": job})
        api.call("POST", f"{path}/wait_for_fleet/xcomEntries", {"key": "return_value", "value": {
            "cluster_name": "uc-ui-test", "address": "127.100.9.1", "host_key": "-", "partition": "train"}})
        yield run_id, job
    finally:
        api.call("DELETE", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}")
        api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": dag["is_paused"]})


def test_every_plugin_route_refuses_a_request_without_airflows_authentication(airflow_local, sweep_report,
                                                                               train_job):
    api, _ = airflow_local
    run_id, job = train_job
    paths = ["/ultracluster/reports", f"/ultracluster/reports/{DAG_ID}/{sweep_report}",
             f"/ultracluster/reports/{DAG_ID}/{sweep_report}/plot.png",
             f"/ultracluster/jobs/{DAG_ID}/{quote(run_id, safe='')}/train"]
    for path in paths:
        status, _, body = get(api, path)
        assert status == 401, (path, status, body[:300])
        assert get(api, path, token="not-a-jwt")[0] == 403, path
        assert get(api, path, cookie="not-a-jwt")[0] in (401, 403), path
        # The same request with a token from POST /auth/token, as the client and curl send it.
        status, content_type, body = get(api, path, token=api.token)
        assert status == 200, (path, status, body[:300])
        assert content_type.startswith("image/png" if path.endswith(".png") else "text/html"), (path, content_type)
    # Registered through the package's entry point: Airflow lists the plugin, its app and its nav entry.
    [plugin] = [p for p in api.call("GET", "/api/v2/plugins?limit=100")["plugins"] if p["name"] == "ultracluster"]
    assert [(a["url_prefix"], a["name"]) for a in plugin["fastapi_apps"]] == [("/ultracluster", "ultracluster")]
    assert [(v["name"], v["href"], v["category"]) for v in plugin["external_views"]] == [
        ("Scaling reports", "ultracluster/reports", "browse")]
    assert plugin["source"].startswith("ultracluster==")


def test_the_slurm_job_page_shows_the_job_its_state_and_its_log(airflow_local, train_job):
    api, _ = airflow_local
    run_id, job = train_job
    status, _, body = get(api, f"/ultracluster/jobs/{DAG_ID}/{quote(run_id, safe='')}/train", token=api.token)
    page = body.decode()
    assert status == 200, page
    assert f'<dd id="slurm-job-id">{job["job_id"]}</dd>' in page
    assert f'<dd id="slurm-job-state">{job["state"]}</dd>' in page and job["state"] == "COMPLETED"
    assert f'<dd id="log-on-the-head-node">{job["log_path"]}</dd>' in page
    assert job["log_path"].endswith(f"/slurm-{job['job_id']}.out")
    status, _, _ = get(api, f"/ultracluster/jobs/{DAG_ID}/{quote(run_id, safe='')}/no_such_task", token=api.token)
    assert status == 404


def small_png(png: bytes) -> bytes:
    """A screenshot in 256 colours: the README's picture stays small."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        out = io.BytesIO()
        image.convert("RGB").quantize(colors=256).save(out, format="PNG", optimize=True)
    return out.getvalue()


def test_the_scaling_reports_page_lists_the_sweep_and_shows_its_plot(browser, airflow_local, sweep_report):  # noqa: F811
    api, _ = airflow_local
    page = logged_in_page(browser, api)
    try:
        # The nav's Browse menu has the plugin's page; the UI shows it in a frame.
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="Scaling reports").click()
        page.wait_for_url(f"{api.base}/plugin/scaling-reports")
        frame = page.frame_locator('iframe[title="Scaling reports"]')
        frame.get_by_role("heading", name="Scaling reports").wait_for()
        link = frame.get_by_role("link", name=sweep_report, exact=True)
        link.wait_for()
        page.screenshot(path=str(SHOTS / "scaling-reports-list.png"))

        link.click()
        plot = frame.locator("img#plot")
        plot.wait_for()
        frame.locator("table").wait_for()
        # The image loaded (the frame's request carried the UI's cookie): real pixels, not a broken icon.
        size = plot.evaluate("img => img.decode().then(() => [img.complete, img.naturalWidth, img.naturalHeight])")
        assert size[0] is True and size[1] > 0 and size[2] > 0, size
        assert size[1:] == [800, 600]  # ultracluster/report/plot.py: 8 x 6 inches at 100 dpi
        headers = frame.locator("th").all_inner_texts()
        assert headers[:4] == ["Nodes", "Model", "Device", "World size"] and "Cost (USD)" in headers
        rows = frame.locator("tbody tr")
        assert rows.count() >= 2
        # What really trained: the tiny BERT on CPU, and no Trn1 reference beside it.
        cells = rows.first.locator("td").all_inner_texts()
        assert cells[1].startswith("BERT-tiny") and cells[2] == "CPU", cells
        assert frame.locator("h1").inner_text().endswith(f"sweep {sweep_report}")
        page.wait_for_timeout(500)
        shot = page.screenshot()
        (SHOTS / "scaling-report.png").write_bytes(shot)
        README_SHOT.write_bytes(small_png(shot))
        assert README_SHOT.stat().st_size < 200_000, README_SHOT.stat().st_size
    finally:
        page.close()

    # The browser's way in is the login's cookie: a fresh browser, never logged in, is refused.
    anonymous = browser.new_page()
    try:
        response = anonymous.goto(f"{api.base}/ultracluster/reports/{DAG_ID}/{sweep_report}")
        assert response.status == 401 and "Sign in" in anonymous.content()
    finally:
        anonymous.close()
