"""The Airflow UI in a real browser: Debian's chromium, driven headless by Playwright for Python (no
browser download), against Airflow started by scripts/airflow.sh as `make up` starts it.

A user logs in, sees the DAG's tasks in the graph view, opens the trigger dialog and finds the Trigger
button enabled with the defaults (in the production profile too, where nothing is run), triggers a run
with one click, watches it reach success, and reads train's log with its streamed progress lines.
In the same dialog's Backfill mode a user backfills a scaling sweep over three weekly ticks (the DAG
left paused, so nothing trains) and sees a bad sweep refused with the server's 422.
Screenshots go to out/browser/ (git-ignored).
"""
from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.e2e.conftest import (
    DAG_ID,
    REPO,
    RUN_TIMEOUT_S,
    RUNTIME_READY,
    TASK_IDS,
    assert_nothing_left,
    start_airflow,
    stop_airflow,
)
from tests.e2e.test_pipeline import check_results
from ultracluster.params import dag_params
from ultracluster.run.form import SECTIONS
from ultracluster.run.profiles import load_profile
from ultracluster.run.sweep import sweep_point

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

CHROMIUM = "/usr/bin/chromium"
# Headless as root, and no calls home: this machine's network is closed.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = REPO / "out" / "browser"
# Params per form section (the counts are the same in every profile).
PARAMS_PER_SECTION = Counter(p.schema["section"] for p in dag_params(load_profile("local")).values())
# The UI's backfill: three consecutive weekly ticks (Sundays 00:00 UTC; none of test_sweep.py's).
UI_TICKS = ["2026-10-04", "2026-10-11", "2026-10-18"]
UI_SWEEP = {"id": "ui-sweep", "num_nodes": [1, 2, 3], "scaling_mode": "weak"}
WEEK = timedelta(days=7)  # the DAG's SCHEDULE_PERIOD (@weekly)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not Path(CHROMIUM).exists():
        # CI installs it (scripts/setup_apt.sh): there a missing browser is a failure, not a skip.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"{CHROMIUM} missing: run `make setup`")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def logged_in_page(browser, api):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    page.goto(f"{api.base}/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(api.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{api.base}/")
    return page


def open_trigger_dialog(page, api, shot: str):
    """The trigger dialog; asserts that no field of any param section is flagged and Trigger is enabled."""
    page.goto(f"{api.base}/dags/{DAG_ID}")
    page.get_by_test_id("trigger-dag-button").click()
    dialog = page.get_by_role("dialog")
    for section in SECTIONS:  # the accordion shows one section at a time
        trigger = dialog.locator(f'[data-part="item-trigger"][id$=":trigger:{section}"]')
        trigger.click()
        assert trigger.get_attribute("aria-expanded") == "true", section
        content = dialog.locator(f'[data-part="item-content"][id$=":content:{section}"]')
        content.locator("label").first.wait_for()
        assert content.locator("label").count() >= PARAMS_PER_SECTION[section], section  # its params are shown
        invalid = content.locator("[data-invalid]")
        assert invalid.count() == 0, (section, [invalid.nth(i).inner_text() for i in range(invalid.count())])
        if section == SECTIONS[0]:
            dialog.screenshot(path=str(SHOTS / shot))
    submit = dialog.get_by_test_id("trigger-dag-submit")
    assert submit.is_enabled(), "the Trigger button is disabled with the default params"
    return dialog


def test_trigger_form_is_valid_with_the_production_defaults(browser, tmp_path):
    """Only the form: a production run is never started here (and no local stand-in is configured)."""
    env = {**os.environ, "ULTRACLUSTER_PROFILE": "production", "LOCAL_ULTRACLUSTER_HOME": str(tmp_path / "none")}
    api, env = start_airflow(env, tmp_path / "airflow-production")
    try:
        api.wait_for_dag(DAG_ID)
        page = logged_in_page(browser, api)
        dialog = open_trigger_dialog(page, api, "trigger-form-production.png")
        # The production profile's defaults are what the form shows: 16 nodes of BERT-Large.
        dialog.locator('[data-part="item-trigger"][id$=":trigger:Cluster"]').click()
        training_nodes = dialog.get_by_role("spinbutton").first
        assert training_nodes.get_attribute("aria-valuenow") == "16"
        page.close()
    finally:
        stop_airflow(env)


def test_a_user_triggers_a_run_from_the_ui_and_reads_its_log(browser, airflow_local, e2e_home):
    api, env = airflow_local
    page = logged_in_page(browser, api)

    # The DAG's tasks in the graph view.
    page.goto(f"{api.base}/dags/{DAG_ID}")
    page.get_by_role("button", name=re.compile("Show Graph")).click()
    nodes = page.locator(".react-flow__node")
    nodes.first.wait_for()
    assert {nodes.nth(i).inner_text().split()[0] for i in range(nodes.count())} == TASK_IDS

    # One click on the defaults; the dialog unpauses the DAG itself.
    dialog = open_trigger_dialog(page, api, "trigger-form-local.png")
    dialog.get_by_test_id("trigger-dag-submit").click()
    page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/[^/]+$"))
    run_id = unquote(page.url.rsplit("/runs/", 1)[1])

    # Watch the run's state badge in the UI until it ends.
    badge = page.get_by_test_id("state-badge").first
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (state := badge.inner_text().strip()) not in ("Success", "Failed"):
        assert time.monotonic() < deadline, f"run {run_id} still {state!r} in the UI"
        page.wait_for_timeout(5000)
        page.reload()
        badge = page.get_by_test_id("state-badge").first
    page.screenshot(path=str(SHOTS / "run.png"))
    assert state == "Success", api.task_states(DAG_ID, run_id)
    assert api.task_states(DAG_ID, run_id) == {task: "success" for task in TASK_IDS}

    # The graph view with every task done (the README's picture).
    page.set_viewport_size({"width": 1600, "height": 640})
    page.goto(f"{api.base}/dags/{DAG_ID}/runs/{run_id}")
    page.get_by_role("button", name=re.compile("Show Graph")).click()
    page.locator(".react-flow__node").first.wait_for()
    collapse = page.get_by_role("button", name="Collapse Details Panel")
    if collapse.count():  # a wider graph for the picture; the page works either way
        collapse.first.click()
    if page.locator(".react-flow__controls-fitview").count():
        page.locator(".react-flow__controls-fitview").first.click()
    page.wait_for_timeout(1500)
    page.screenshot(path=str(SHOTS / "graph.png"))
    page.set_viewport_size({"width": 1400, "height": 1000})

    # train's log: the streamed progress, few lines, no SSH chatter.
    page.goto(f"{api.base}/dags/{DAG_ID}/runs/{run_id}/tasks/train")
    page.get_by_text("UC_RESULTS").first.wait_for()
    page.screenshot(path=str(SHOTS / "train-log.png"))
    log = page.locator("body").inner_text()
    steps = [int(m) for m in re.findall(r"UC_PROGRESS step=(\d+) total=40", log)]
    assert steps == [1, 10, 20, 30, 40], steps  # the local profile shows every 10th step, first and last
    assert "Requesting new SSH session" not in log and "[conn=" not in log

    xcom = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/collect_results"
                    "/xcomEntries/return_value")
    check_results(xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"]), env, run_id)
    assert_nothing_left(env, e2e_home)
    page.close()


def ui_backfill_runs(api) -> list[dict]:
    """The runs at UI_TICKS, whatever made them."""
    runs = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?logical_date_gte={UI_TICKS[0]}T00:00:00Z"
                           f"&logical_date_lte={UI_TICKS[-1]}T00:00:00Z&limit=100")["dag_runs"]
    return sorted(runs, key=lambda run: run["logical_date"])


def open_backfill_dialog(page, api, sweep: dict):
    """The Trigger button's dialog in Backfill mode, filled as a user fills it: UI_TICKS' first and last
    tick, the DAG left paused, the form's conf sent, `sweep` typed into the Scaling sweep field."""
    from playwright.sync_api import expect

    page.goto(f"{api.base}/dags/{DAG_ID}")
    page.get_by_test_id("trigger-dag-button").click()
    dialog = page.locator('[data-scope="dialog"][data-part="content"]')  # not the date pickers' popovers
    dialog.get_by_text("Backfill", exact=True).click()
    picker = page.locator('[data-scope="popover"][data-part="content"][data-state="open"]')
    for nth, day in enumerate((UI_TICKS[0], UI_TICKS[-1])):  # From, To: both bounds are inclusive
        dialog.get_by_test_id("datetime-input").nth(nth).click()
        expect(picker).to_contain_text("UTC")  # the UI's time zone: the ticks are UTC midnights
        picker.get_by_placeholder("YYYY/MM/DD").fill(day.replace("-", "/"))
        picker.get_by_placeholder("HH:mm").fill("00:00")
        page.keyboard.press("Escape")  # closes the picker, not the dialog
    # The dialog's own dry run (without the conf) plans one run per tick.
    expect(dialog.get_by_text(f"{len(UI_TICKS)} runs will be triggered.")).to_be_visible()

    def tick(label: str, checked: bool) -> None:
        box = dialog.get_by_role("checkbox", name=label)
        if box.is_checked() != checked:
            dialog.get_by_text(label, exact=True).click()
        expect(box).to_be_checked(checked=checked)

    # Shown, and ticked, only while the DAG is paused: the test keeps it paused, so no run starts.
    tick(f"Unpause {DAG_ID} on trigger", False)
    # Unticked (the default) the dialog sends "dag_run_conf": null, whatever the form holds.
    tick("Override parameters on existing runs", True)

    dialog.locator('[data-part="item-trigger"][id$=":trigger:Sweep and cost"]').click()
    editor = dialog.locator("#element_sweep .monaco-editor")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(json.dumps(sweep))  # typed key by key, Monaco would auto-close brackets
    deadline = time.monotonic() + 10
    while True:  # the form re-renders the field as indented JSON
        shown = editor.locator(".view-lines").inner_text().replace("\xa0", " ")
        try:
            if json.loads(shown) == sweep:
                break
        except ValueError:
            pass
        assert time.monotonic() < deadline, f"the Scaling sweep field shows {shown!r}"
        page.wait_for_timeout(200)
    return dialog


def run_backfill(page, dialog):
    """Presses Run Backfill; the response of the POST /api/v2/backfills it sends."""
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/api/v2/backfills")) as sent:
        dialog.get_by_role("button", name="Run Backfill").click()
    return sent.value


@pytest.mark.parametrize("sweep, message", [
    ({"id": "ui-bad", "num_nodes": []}, "Invalid input for param sweep: [] should be non-empty"),  # 0 points
    ({"id": "ui-bad", "num_nodes": [1, "two"]}, "Invalid input for param sweep: 'two' is not of type 'integer'"),
], ids=["no-points", "string-point"])
def test_a_bad_sweep_in_the_backfill_dialog_shows_the_servers_422(browser, airflow_local, sweep, message, request):
    api, _ = airflow_local
    dag = api.call("GET", f"/api/v2/dags/{DAG_ID}")
    backfills = api.call("GET", f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]
    api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": True})  # were it accepted, nothing would start
    page = logged_in_page(browser, api)
    try:
        dialog = open_backfill_dialog(page, api, sweep)
        response = run_backfill(page, dialog)
        assert response.status == 422, response.text()
        assert message in response.json()["detail"], response.text()
        # The dialog stays open with the server's answer at its top.
        alert = dialog.get_by_test_id("error-alert")
        alert.wait_for()
        assert "422 Validation Error" in alert.inner_text() and message in alert.inner_text()
        alert.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / f"backfill-refused-{request.node.callspec.id}.png"))
    finally:
        page.close()
        api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": dag["is_paused"]})
    assert api.call("GET", f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"] == backfills
    assert ui_backfill_runs(api) == []


def test_a_user_backfills_a_sweep_from_the_ui_dialog(browser, airflow_local, e2e_home):
    """Backfill mode of the trigger dialog, one point per tick. The DAG stays paused, so the runs stay
    queued (Airflow starts no run of a paused DAG, backfill or not); the backfill is then cancelled
    (its queued runs fail) and its runs deleted, which also puts the DAG's next scheduled tick back."""
    api, env = airflow_local
    dag = api.call("GET", f"/api/v2/dags/{DAG_ID}")
    known = {b["id"] for b in api.call("GET", f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]}
    assert ui_backfill_runs(api) == []
    # Pausing would hold up a run in flight (Airflow schedules no task of a paused DAG).
    in_flight = [r["dag_run_id"] for r in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
                 if r["state"] in ("queued", "running")]
    assert in_flight == []
    api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": True})
    page = logged_in_page(browser, api)
    created = None
    try:
        dialog = open_backfill_dialog(page, api, UI_SWEEP)
        response = run_backfill(page, dialog)
        assert response.status == 200, response.text()
        created = response.json()["id"]
        dialog.wait_for(state="detached")  # closed on success
        page.get_by_text("Backfill in progress").wait_for()  # the DAG page's banner
        page.screenshot(path=str(SHOTS / "backfill-created.png"))

        [backfill] = [b for b in api.call("GET", f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]
                      if b["id"] not in known]
        assert backfill["id"] == created and backfill["completed_at"] is None
        assert (backfill["from_date"], backfill["to_date"]) == (f"{UI_TICKS[0]}T00:00:00Z", f"{UI_TICKS[-1]}T00:00:00Z")
        # The dialog sends the whole form: the DAG's defaults, and the sweep typed into it.
        conf = backfill["dag_run_conf"]
        assert conf["sweep"] == UI_SWEEP
        defaults = {name: p["value"] for name, p in api.call("GET", f"/api/v2/dags/{DAG_ID}/details")["params"].items()}
        assert {**conf, "sweep": None} == {**defaults, "sweep": None}

        runs = ui_backfill_runs(api)
        assert [r["logical_date"] for r in runs] == [f"{day}T00:00:00Z" for day in UI_TICKS]
        assert all(r["run_type"] == "backfill" and r["conf"] == conf for r in runs), runs
        # Each tick picks its point as the DAG picks it (preflight calls the same function).
        points = [sweep_point(r["conf"]["sweep"], datetime.fromisoformat(r["logical_date"]), WEEK) for r in runs]
        assert sorted(p["num_nodes"] for p in points) == UI_SWEEP["num_nodes"], points
        assert {p["chosen_by"] for p in points} == {"logical_date"}

        # Paused, the scheduler starts none of them (it loops every second or so).
        for _ in range(5):
            time.sleep(3)
            states = {r["dag_run_id"]: r["state"] for r in ui_backfill_runs(api)}
            assert set(states.values()) == {"queued"}, states
            for run_id in states:
                assert set(api.task_states(DAG_ID, run_id).values()) <= {None}, run_id
        assert api.call("GET", f"/api/v2/dags/{DAG_ID}")["is_paused"] is True

        # Cancelled, the backfill is complete and its queued runs failed: no run can start any more.
        cancelled = api.call("PUT", f"/api/v2/backfills/{created}/cancel")
        assert cancelled["completed_at"] is not None
        assert {r["state"] for r in ui_backfill_runs(api)} == {"failed"}
    finally:
        page.close()
        if created is not None:
            active = api.call("GET", f"/api/v2/backfills/{created}")
            if active["completed_at"] is None:
                api.call("PUT", f"/api/v2/backfills/{created}/cancel")
        for run in ui_backfill_runs(api):
            api.call("DELETE", f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}")
        gone = datetime.now(timezone.utc) + timedelta(seconds=1)
        # The backfill's runs had moved the schedule on (docs/operations.md): unpaused, the DAG would
        # run the latest tick. Wait for a parse that no longer sees them (the dag-processor reads the
        # latest run, then stamps last_parsed_time) to put the next tick back; only then unpause.
        deadline = time.monotonic() + 120
        while True:
            now = api.call("GET", f"/api/v2/dags/{DAG_ID}")
            if (datetime.fromisoformat(now["last_parsed_time"]) > gone
                    and now["next_dagrun_logical_date"] == dag["next_dagrun_logical_date"]):
                break
            assert time.monotonic() < deadline, (now, dag["next_dagrun_logical_date"])
            time.sleep(2)
        api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": dag["is_paused"]})
    in_flight = [r["dag_run_id"] for r in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
                 if r["state"] in ("queued", "running")]
    assert in_flight == []
    assert_nothing_left(env, e2e_home)
