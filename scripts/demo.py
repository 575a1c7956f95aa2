"""`make demo`: trigger trn1_bert_pretrain through the Airflow REST API on the local deployment,
follow it task by task, and print the collected results. Exits non-zero unless the run succeeds."""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

DAG_ID = "trn1_bert_pretrain"
BASE = os.environ.get("AIRFLOW__API__BASE_URL", "http://127.0.0.1:8080")
TIMEOUT_S = float(os.environ.get("DEMO_TIMEOUT_S", "1800"))


def call(method: str, path: str, token: str | None = None, body: dict | None = None) -> dict:
    req = urllib.request.Request(BASE + path, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(req, data=data, timeout=30) as resp:
        return json.loads(resp.read() or b"{}")


def wait_for_dag(token: str) -> None:
    # The dag-processor parses the file a few seconds after start; unpause once it is known.
    deadline = time.monotonic() + 120
    while True:
        try:
            call("PATCH", f"/api/v2/dags/{DAG_ID}", token, {"is_paused": False})
            return
        except urllib.error.HTTPError as err:
            if err.code != 404 or time.monotonic() > deadline:
                raise
            time.sleep(2)


def main() -> int:
    token = call("POST", "/auth/token", body={"username": "admin", "password": "admin"})["access_token"]
    wait_for_dag(token)
    conf = json.loads(os.environ.get("DEMO_CONF", "{}"))
    run = call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", token, {"logical_date": None, "conf": conf})
    run_id = run["dag_run_id"]
    print(f"demo: triggered {DAG_ID} run {run_id} via the REST API (conf {json.dumps(conf)})")
    print(f"demo: follow it at {BASE}/dags/{DAG_ID}/runs/{run_id}")
    seen: dict[str, str] = {}
    start = time.monotonic()
    state = run["state"]
    while state not in ("success", "failed") and time.monotonic() - start < TIMEOUT_S:
        time.sleep(3)
        tis = call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", token)["task_instances"]
        for ti in sorted(tis, key=lambda t: t.get("start_date") or "~"):
            if ti["state"] and seen.get(ti["task_id"]) != ti["state"]:
                seen[ti["task_id"]] = ti["state"]
                print(f"  {time.monotonic() - start:7.1f}s  {ti['task_id']:<16} {ti['state']}")
        state = call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}", token)["state"]
    print(f"demo: run {run_id} finished: {state} in {time.monotonic() - start:.0f} s")
    try:
        xcom = call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/collect_results"
                    "/xcomEntries/return_value", token)
        metrics = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    except (urllib.error.HTTPError, KeyError, ValueError):
        metrics = None
    if metrics:
        print("\nResults (collect_results):")
        width = max(len(k) for k in metrics)
        for key, value in metrics.items():
            print(f"  {key:<{width}}  {value}")
    return 0 if state == "success" and metrics else 1


if __name__ == "__main__":
    sys.exit(main())
