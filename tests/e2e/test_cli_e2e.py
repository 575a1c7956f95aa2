"""The `ultracluster` console script against a real Airflow (the session's ``airflow_local``): its login
(the password from the local passwords file, a wrong one refused), a backfill dry run that plans
exactly the CLI's weekly window (and `airflow backfill create --dry-run` plans it with a sweep conf),
the server's own rejection of a bad sweep conf, a missing run.
Creates no run and leaves the DAG's paused state alone: the other end-to-end tests share this Airflow."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.e2e.conftest import DAG_ID, REPO, RUNTIME_READY, VENVS
from ultracluster.cli.sweeps import iso, past_ticks

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]


def ultracluster(base: str, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ULTRACLUSTER_AIRFLOW_")}
    return subprocess.run([str(VENVS / "airflow" / "bin" / "ultracluster"), "--url", base, *args],
                          env={**clean, **env}, capture_output=True, text=True, timeout=timeout)


def test_the_cli_against_a_real_airflow(airflow_local):
    api, env = airflow_local

    done = ultracluster(api.base, "--password", "wrong", "status", "no-such-run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (f"ultracluster: error: Airflow at {api.base} refused the credentials of user 'admin' "
                           "(HTTP 401: Invalid credentials); check --username/--password or "
                           "ULTRACLUSTER_AIRFLOW_USERNAME/ULTRACLUSTER_AIRFLOW_PASSWORD\n")

    # No password given: the one in the simple auth manager's passwords file (as scripts/env.sh sets it).
    passwords = str(Path(env["AIRFLOW_HOME"]) / "passwords.json")
    done = ultracluster(api.base, "status", "no-such-run", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=passwords)
    assert done.returncode == 2
    assert done.stderr.startswith(f"ultracluster: error: not found: GET /api/v2/dags/{DAG_ID}/dagRuns/no-such-run "
                                  "(HTTP 404): "), done.stderr

    # Airflow plans exactly the last two weekly ticks for the window the CLI picks.
    ticks = [iso(tick) for tick in past_ticks(datetime.now(timezone.utc), 2)]
    done = ultracluster(api.base, "--password", api.password, "sweep", "--id", "e2e-cli", "--nodes", "1,2",
                        "--via", "backfill", "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == (f"sweep e2e-cli: backfill {DAG_ID} from {ticks[0]} to {ticks[1]}; "
                                           "the dry run plans 2 runs, each training the point of its week "
                                           "(weeks since 2023-01-01 modulo 2):")
    assert [line.split()[0] for line in done.stdout.splitlines()[1:]] == ticks

    # The same window through `airflow backfill create`, as a user runs it on the deployment (with
    # scripts/env.sh's settings): the sweep conf is accepted and both ticks planned; a bad one refused.
    def airflow_cli(*args: str) -> subprocess.CompletedProcess:
        command = ". scripts/env.sh && airflow " + " ".join(shlex.quote(arg) for arg in args)
        return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)

    sweep = {"sweep": {"id": "e2e-cli", "num_nodes": [1, 2], "scaling_mode": "weak"}}
    window = ("backfill", "create", "--dag-id", DAG_ID, "--from-date", ticks[0], "--to-date", ticks[1], "--dry-run")
    done = airflow_cli(*window, "--dag-run-conf", json.dumps(sweep))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert all(tick[:10] in done.stdout for tick in ticks), done.stdout
    done = airflow_cli(*window, "--dag-run-conf", json.dumps({"sweep": {"id": "Bad Id", "num_nodes": [1, 2]}}))
    assert done.returncode != 0 and "Bad Id" in done.stdout + done.stderr, done.stdout[-2000:] + done.stderr[-2000:]

    # A sweep id the DAG's params reject: the server's message, on one line.
    done = ultracluster(api.base, "--password", api.password, "sweep", "--id", "Bad Id", "--nodes", "1,2",
                        "--via", "backfill", "--dry-run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(
        "ultracluster: error: Airflow rejected POST /api/v2/backfills/dry_run (HTTP 422): "), done.stderr
    assert "Invalid input for param sweep: 'Bad Id' does not match" in done.stderr and done.stderr.count("\n") == 1
