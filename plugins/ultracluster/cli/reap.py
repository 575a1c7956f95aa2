"""`ultracluster reap [--dry-run]`: the orphan reaper from the command line (docs/client.md).

The same rules and deletes as the ultracluster_reaper DAG (ultracluster.reaper); runs' states come
from the REST API. AWS and pcluster are reached through the deployment's Airflow connections
(``AIRFLOW_CONN_*`` in the environment, as ``$LOCAL_ULTRACLUSTER_HOME/airflow.env`` sets them).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

from ultracluster.cli.client import AirflowClient, CliError, segment
from ultracluster.run.profiles import ProfileError, load_profile


def api_run_state(client: AirflowClient):
    """(dag_id, run_id) -> the run's state from the API; None when Airflow has no such run."""
    def run_state(dag_id: str, run_id: str) -> str | None:
        run = client.get(f"/api/v2/dags/{segment(dag_id)}/dagRuns/{segment(run_id)}", missing_ok=True)
        return None if run is None else run.get("state")
    return run_state


def add_parser(commands: argparse._SubParsersAction, shared: argparse.ArgumentParser) -> None:
    reap = commands.add_parser("reap", parents=[shared], help="delete clusters, stacks and S3 scratch of ended runs")
    reap.add_argument("--dry-run", action="store_true", help="list what would be deleted and why; delete nothing")
    reap.add_argument("--region", help="the region to scan (default: the profile's)")
    reap.add_argument("--artifacts-s3-uri", help="the pipeline's artifacts_s3_uri (default: the profile's; '' for none)")
    reap.add_argument("--aws-conn-id", default="aws_default", help="Airflow connection for AWS (aws_default)")
    reap.add_argument("--pcluster-conn-id", default="pcluster_default", help="the pcluster connection (pcluster_default)")
    reap.add_argument("--json", action="store_true", help="print the summary as JSON")
    reap.set_defaults(handler=cmd_reap)


def cmd_reap(client: AirflowClient, args: argparse.Namespace) -> int:
    try:
        profile = load_profile() if args.region is None or args.artifacts_s3_uri is None else {}
    except ProfileError as exc:
        raise CliError(f"profile: {exc}; pass --region and --artifacts-s3-uri") from None
    region = args.region if args.region is not None else profile.get("region")
    artifacts = args.artifacts_s3_uri if args.artifacts_s3_uri is not None else profile.get("artifacts_s3_uri")
    poll_s = float(profile.get("cluster_poll_interval_s") or 15)
    # The hooks' and the reaper's logs go to stderr, so stdout holds the verdicts only. A redirect for
    # this call, not a logging configuration: that would outlive the command in the process.
    with contextlib.redirect_stdout(sys.stderr):
        from ultracluster.reaper import build_reaper  # Airflow's hooks: the client's other commands start without them

        reaper = build_reaper(api_run_state(client), aws_conn_id=args.aws_conn_id,
                              pcluster_conn_id=args.pcluster_conn_id, region_name=region,
                              artifacts_s3_uri=artifacts, poll_s=poll_s, retry_delay_s=4 * poll_s)
        result = reaper.reap(dry_run=args.dry_run)
    if args.json:
        print(json.dumps(result.summary(), indent=2, sort_keys=True), flush=True)
    else:
        verb = "would delete" if args.dry_run else "orphan"
        for verdict in result.orphans:
            print(f"{verb}: {verdict.line()}", flush=True)
        for verdict in result.deleted:
            print(f"deleted: {verdict.line()}", flush=True)
        for what, why in result.left.items():
            print(f"NOT deleted: {what}: {'; '.join(why[:5])}", flush=True)
        if not result.orphans:
            print("no orphans", flush=True)
    return 1 if result.left else 0
