"""The Airflow UI in a real browser: Debian's chromium, driven headless by Playwright for Python (no
browser download), against Airflow started by scripts/airflow.sh as `make up` starts it.

A user logs in, sees the DAG's tasks in the graph view, opens the trigger dialog and finds the Trigger
button enabled with the defaults (in the production profile too, where nothing is run), triggers a run
with one click, watches it reach success, and reads train's log with its streamed progress lines.
Screenshots go to out/browser/ (git-ignored).
"""
from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
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
from ultracluster.params import SECTIONS, dag_params
from ultracluster.profiles import load_profile

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

CHROMIUM = "/usr/bin/chromium"
# Headless as root, and no calls home: this machine's network is closed.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = REPO / "out" / "browser"
# Params per form section (the counts are the same in every profile).
PARAMS_PER_SECTION = Counter(p.schema["section"] for p in dag_params(load_profile("local")).values())


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
