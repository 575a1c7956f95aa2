"""`ultracluster trigger`, `status` and `report`, and what they share with `sweep`: a run's conf from
the command line, unpausing the DAG, triggering a run."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ultracluster.cli.client import DEFAULT_DAG, AirflowClient, CliError, segment
from ultracluster.cli.follow import Followed, follow, run_path, say, task_instances, task_line, task_name, xcom_value
from ultracluster.report.records import XCOM_TASKS
from ultracluster.report.summary import run_summary, summary_lines
from ultracluster.run.cost import NO_PRICES, PriceError, load_prices

REPORT_DAG = "trn1_scaling_report"
REPORT_TASK = "build_report"


def parse_param(text: str) -> tuple[str, object]:
    """``KEY=VALUE``: the value as JSON when it parses (``4``, ``true``, ``{"id": "s1"}``), else the string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise CliError(f"--param {text!r}: expected KEY=VALUE")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def build_conf(conf_file: str | None, params: list[str]) -> dict:
    """The run conf: the JSON object of ``conf_file`` ('-': stdin), then every ``--param`` over it."""
    conf: dict = {}
    if conf_file:
        try:
            text = sys.stdin.read() if conf_file == "-" else Path(conf_file).read_text()
            loaded = json.loads(text or "{}")
        except OSError as exc:
            raise CliError(f"--conf-file {conf_file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise CliError(f"--conf-file {conf_file}: not JSON ({exc})") from None
        if not isinstance(loaded, dict):
            raise CliError(f"--conf-file {conf_file}: expected a JSON object, got {type(loaded).__name__}")
        conf.update(loaded)
    conf.update(parse_param(param) for param in params)
    return conf


def ensure_unpaused(client: AirflowClient, dag_id: str, wait_s: float = 0) -> None:
    """Unpause the DAG if it is paused (its runs would stay queued). A DAG Airflow does not know
    yet (the dag-processor parses a new file a few seconds after start) is waited for ``wait_s``."""
    path = f"/api/v2/dags/{segment(dag_id)}"
    deadline = time.monotonic() + wait_s
    while (dag := client.get(path, missing_ok=True)) is None:
        if time.monotonic() >= deadline:
            waited = f" (waited {wait_s:.0f} s)" if wait_s else ""
            raise CliError(f"Airflow at {client.base} has no DAG {dag_id!r}{waited}: is its file in the DAGs "
                           "folder, and parsed without import errors?")
        time.sleep(2)
    if dag.get("is_paused"):
        client.patch(path, {"is_paused": False})
        say(f"unpaused {dag_id}")


def start_run(client: AirflowClient, dag_id: str, conf: dict) -> str:
    """Trigger a run now (no logical date) and return its id."""
    run = client.post(f"/api/v2/dags/{segment(dag_id)}/dagRuns", {"logical_date": None, "conf": conf})
    return run["dag_run_id"]


def trigger_and_follow(client: AirflowClient, args: argparse.Namespace, dag_id: str,
                       conf: dict) -> tuple[Followed, bool]:
    """Unpause, trigger, print the run id and its UI page, follow unless --no-follow. Returns the
    run (its last task states) and whether it succeeded; not followed counts as succeeded."""
    ensure_unpaused(client, dag_id, args.wait_for_dag)
    run = Followed(dag_id, start_run(client, dag_id, conf))
    say(f"triggered {dag_id} run {run.run_id} (conf {json.dumps(conf, sort_keys=True)})")
    say(f"  {client.ui_url(dag_id, run.run_id)}")
    if args.no_follow:
        return run, True
    return run, follow(client, [run], poll_s=args.poll_interval, timeout_s=args.timeout)


def cmd_trigger(client: AirflowClient, args: argparse.Namespace) -> int:
    run, ok = trigger_and_follow(client, args, args.dag, build_conf(args.conf_file, args.param))
    if args.results and not args.no_follow:
        value = xcom_value(client, args.dag, run.run_id, args.results)
        show_results(value, args.results)
        show_summary(client, args.dag, run.run_id, "success" if ok else "failed", {args.results: value})
    return 0 if ok else 1


def show_summary(client: AirflowClient, dag_id: str, run_id: str, state: str, known: dict) -> None:
    """The run summary (report/summary.py): time, idle fleet minutes, instance-hours and cost.
    ``known``: XComs already fetched, by task id."""
    xcoms = {task: known[task] if task in known else xcom_value(client, dag_id, run_id, task) for task in XCOM_TASKS}
    if not any(xcoms.values()):
        return   # not a pipeline run: nothing to sum up
    try:
        prices = load_prices()
    except PriceError as err:   # the summary still has EC2's cost; only estimates need prices
        say(f"(no prices file: {err})")
        prices = NO_PRICES
    lines = summary_lines(run_summary(state, xcoms, prices))
    width = max(len(label) for label, _ in lines)
    say("\nRun summary:")
    for label, text in lines:
        say(f"  {label:<{width}}  {text}")


def show_results(value: object, task_id: str) -> None:
    """A task's return value as the demo shows it: one aligned ``key  value`` line per key."""
    if value is None:
        return
    say(f"\nResults ({task_id}):")
    if not isinstance(value, dict) or not value:
        say(f"  {json.dumps(value)}")
        return
    width = max(len(str(key)) for key in value)
    for key, item in value.items():
        say(f"  {key:<{width}}  {item}")


def cmd_status(client: AirflowClient, args: argparse.Namespace) -> int:
    run = client.get(run_path(args.dag, args.run_id))
    took = f" in {run['duration']:.0f} s" if run.get("duration") is not None else ""
    say(f"{args.dag} run {args.run_id}: {run['state']}{took}")
    say(f"  {client.ui_url(args.dag, args.run_id)}")
    for ti in task_instances(client, args.dag, args.run_id):
        duration = ti.get("duration")
        say(task_line("", task_name(ti), ti.get("state") or "none", "-" if duration is None else f"{duration:.0f}s"))
    return 0


def cmd_report(client: AirflowClient, args: argparse.Namespace) -> int:
    """Run the report DAG for one sweep, then print its Markdown table and where its files are."""
    conf = {"sweep_id": args.sweep_id, "partial": args.partial}
    if args.dag != DEFAULT_DAG:  # the report DAG's param for another pipeline DAG
        conf["source_dag_id"] = args.dag
    run, ok = trigger_and_follow(client, args, args.report_dag, conf)
    if args.no_follow or not ok:
        return 0 if ok else 1
    if run.tasks.get(REPORT_TASK) == "skipped":
        raise CliError(f"{args.report_dag} run {run.run_id} skipped {REPORT_TASK}: no run of sweep {args.sweep_id} "
                       "found, or some have not ended (--partial reports those that have); its log says which")
    report = xcom_value(client, args.report_dag, run.run_id, REPORT_TASK)
    if not isinstance(report, dict) or "markdown" not in report:
        raise CliError(f"{args.report_dag} run {run.run_id} succeeded but {REPORT_TASK} returned no report "
                       f"(its return value: {json.dumps(report)[:200]})")
    say()
    say(report["markdown"].rstrip())
    say()
    say(f"report files: {report.get('uri')}")
    return 0
