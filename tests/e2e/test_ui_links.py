"""Extra links and the run note in the Airflow UI, in headless Chromium, against the session's real
Airflow on PostgreSQL (``airflow_local``: api-server, scheduler, dag-processor, triggerer).

One run, triggered through the REST API. While `train` waits deferred on its Slurm job, its task page
shows its extra links, and the Slurm Job link points at the ultracluster plugin's page of this run's
`train` under Airflow's own address; the API answers the same href. After the run, every task's links
have their targets (AWS console links are compared, never followed), and the run's note, in the UI
and through the REST API, holds the run summary (nodes, throughput, time to train, cost, idle fleet
minutes) computed from the run's XComs by the client's own summary code.
"""
from __future__ import annotations

import json
import time
from urllib.parse import quote

import pytest

from tests.e2e.conftest import DAG_ID, REPO, RUN_TIMEOUT_S, RUNTIME_READY, TASK_IDS, assert_nothing_left
from tests.e2e.test_ui_browser import SHOTS, browser, logged_in_page  # noqa: F401 - browser is a fixture
from ultracluster.run.names import safe_run_id, vpc_stack_name_for

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

# Twice the local profile's steps: train stays deferred long enough for a browser to look at it.
CONF = {"max_steps": 80, "steps_this_run": 80}
REGION = "us-east-1"
SUMMARY_LABELS = ("nodes", "throughput", "time to train", "final loss", "cluster wall time", "idle fleet",
                  "instance-hours", "cost")


def links(api, run_id: str, task_id: str) -> dict[str, str | None]:
    return api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
                           "/links")["extra_links"]


def xcom(api, run_id: str, task_id: str):
    try:
        entry = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
                                "/xcomEntries/return_value")
    except Exception:  # a task without a return value (urllib's HTTPError 404)
        return None
    value = entry["value"]
    return json.loads(value) if isinstance(value, str) else value


def wait_for_task_state(api, run_id: str, task_id: str, wanted: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (state := api.task_states(DAG_ID, run_id).get(task_id)) != wanted:
        assert state not in ("success", "failed", "upstream_failed"), f"{task_id} is {state}, never {wanted}"
        assert time.monotonic() < deadline, f"{task_id} still {state} after {timeout} s"
        time.sleep(0.5)


def test_extra_links_while_deferred_and_the_run_note(browser, airflow_local, e2e_home):  # noqa: F811
    from ultracluster.run.cost import load_prices
    from ultracluster.report.records import XCOM_TASKS
    from ultracluster.report.run_note import NOTE_TITLE, note_text

    api, env = airflow_local
    page = logged_in_page(browser, api)
    run_id = None
    try:
        api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
        run_id = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": CONF})["dag_run_id"]
        job_page = f"{api.base}/ultracluster/jobs/{DAG_ID}/{quote(run_id, safe='')}/train"

        # train waits on its Slurm job in the triggerer: its link was persisted before it deferred.
        wait_for_task_state(api, run_id, "train", "deferred", RUN_TIMEOUT_S)
        assert links(api, run_id, "train") == {"Slurm Job": job_page}
        page.goto(f"{api.base}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/train/details")
        link = page.get_by_role("link", name="Slurm Job")
        link.wait_for()
        page.get_by_text("Extra Links").first.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "train-deferred-links.png"))
        assert link.get_attribute("href") == job_page
        assert link.get_attribute("target") == "_self"  # Airflow's own origin: the page opens in place
        # Still deferred once the browser has seen it (else the check above proved nothing about a deferral).
        assert api.task_states(DAG_ID, run_id)["train"] == "deferred"

        assert api.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT_S) == "success", api.task_states(DAG_ID, run_id)
        assert api.task_states(DAG_ID, run_id) == {task: "success" for task in TASK_IDS}

        # Every link's target, from the task's own XComs.
        config = xcom(api, run_id, "render_config")
        created = xcom(api, run_id, "pcluster_create")
        results = xcom(api, run_id, "collect_results")
        assert links(api, run_id, "create_vpc") == {"CloudFormation Stack": (
            f"https://console.aws.amazon.com/cloudformation/home?region={REGION}#/stacks/stackinfo?"
            f"stackId={vpc_stack_name_for(run_id)}")}
        assert links(api, run_id, "render_config") == {"Cluster Config (S3)": (
            f"https://s3.console.aws.amazon.com/s3/object/{config['bucket']}?region={REGION}"
            f"&prefix={config['config_s3_key']}")}
        assert links(api, run_id, "pcluster_create") == {"ParallelCluster Stack": (
            f"https://console.aws.amazon.com/cloudformation/home?region={REGION}#/stacks/stackinfo?"
            f"stackId={quote(created['cloudformation_stack_arn'], safe='/')}")}
        assert links(api, run_id, "parallel_compile") == {
            "Slurm Job": f"{api.base}/ultracluster/jobs/{DAG_ID}/{quote(run_id, safe='')}/parallel_compile"}
        prefix = f"runs/results/{DAG_ID}/{safe_run_id(run_id)}"
        assert results["artifacts_uri"] == f"s3://ultracluster-artifacts/{prefix}/"
        # Not a sweep run: no report to link to.
        assert links(api, run_id, "collect_results") == {
            "Results (S3)": f"https://s3.console.aws.amazon.com/s3/buckets/ultracluster-artifacts?region={REGION}"
                            f"&prefix={prefix}/",
            "Sweep Report": None}
        # The job page's values, as the plugin reads them (docs/contracts.md, "Extra links").
        job = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/train"
                              "/xcomEntries/ultracluster_slurm_job")["value"]
        job = json.loads(job) if isinstance(job, str) else job
        trained = xcom(api, run_id, "train")
        assert {k: job[k] for k in ("dag_id", "run_id", "task_id", "job_id", "log_path", "state")} == {
            "dag_id": DAG_ID, "run_id": run_id, "task_id": "train", "job_id": trained["job_id"],
            "log_path": trained["log_path"], "state": trained["state"]}

        # The note: written by the scheduler's listener as the run ended, from the run's XComs.
        xcoms = {task: xcom(api, run_id, task) for task in XCOM_TASKS}
        # Kept (git-ignored) to refresh tests/fixtures/xcoms/, the unit tests' recorded run.
        (REPO / "out" / "e2e").mkdir(parents=True, exist_ok=True)
        (REPO / "out" / "e2e" / "run_xcoms.json").write_text(json.dumps({"run_id": run_id, "xcoms": xcoms}, indent=1))
        expected = note_text("success", xcoms, load_prices())
        note = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}")["note"]
        assert note == expected
        assert all(f"- **{label}**: " in note for label in SUMMARY_LABELS), note
        assert "- **nodes**: 2 (world size 2, global batch 16)" in note
        assert "min (fleet ready to train " in note and "from EC2 instance lives" in note

        # The run's page shows the note's first line; "Edit note" opens it, rendered.
        page.goto(f"{api.base}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}")
        page.get_by_text(NOTE_TITLE.replace("**", "")).first.wait_for()
        page.get_by_role("button", name="Edit note").first.click()
        modal = page.get_by_role("dialog")
        modal.get_by_text("idle fleet").first.wait_for()  # rendered Markdown, not the editor
        page.wait_for_timeout(500)  # the dialog's fade-in, for the screenshot
        page.screenshot(path=str(SHOTS / "run-note.png"))
        shown = modal.inner_text()
        for label, text in (line.removeprefix("- **").split("**: ", 1) for line in note.splitlines()[2:]):
            assert f"{label}: {text}" in shown, (label, text, shown)
        page.keyboard.press("Escape")  # closes without saving
    finally:
        page.close()
        if run_id is not None:  # a paused DAG schedules no task: let a run the test gave up on tear down first
            api.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT_S)
        api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": True})
    assert_nothing_left(env, e2e_home)
