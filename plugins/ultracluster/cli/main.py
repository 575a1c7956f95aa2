"""`ultracluster`: trigger, follow and sweep trn1_bert_pretrain runs through Airflow's REST API v2.

Exit codes: 0 success; 1 a run (or a sweep's run) failed or was not followed to its end, or `reap`
left an orphan it could not delete; 2 an error
(bad credentials, unreachable API, a rejected conf or backfill, bad arguments). docs/client.md.
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime

from ultracluster.cli.client import (
    DEFAULT_DAG,
    DEFAULT_URL,
    DEFAULT_USERNAME,
    ENV_PASSWORD,
    ENV_URL,
    ENV_USERNAME,
    PASSWORDS_FILE_SETTING,
    AirflowClient,
    CliError,
    checkout_root,
    local_password,
    passwords_files,
)
from ultracluster.cli.reap import add_parser as add_reap_parser
from ultracluster.cli.runs import REPORT_DAG, cmd_report, cmd_status, cmd_trigger
from ultracluster.cli.sweeps import cmd_sweep

EPILOG = f"""\
environment: {ENV_URL}, {ENV_USERNAME},
  {ENV_PASSWORD}. Without a password, the local deployment's is used
  (the simple auth manager's passwords file, as `make up` writes it: the file
  {PASSWORDS_FILE_SETTING} names, else the one scripts/env.sh names).
exit codes: 0 success, 1 a run failed (or was not followed to its end), 2 an error."""


def _connection_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """--url/--username/--password/--dag, accepted before and after the subcommand (after it they
    default to SUPPRESS, or argparse would let the subcommand's defaults overwrite the given ones)."""
    def default(value):
        return value if defaults else argparse.SUPPRESS
    parser.add_argument("--url", default=default(os.environ.get(ENV_URL) or DEFAULT_URL),
                        help=f"the Airflow API server (${ENV_URL}; default {DEFAULT_URL})")
    parser.add_argument("--username", default=default(os.environ.get(ENV_USERNAME) or DEFAULT_USERNAME),
                        help=f"${ENV_USERNAME}; default {DEFAULT_USERNAME}")
    parser.add_argument("--password", default=default(os.environ.get(ENV_PASSWORD)),
                        help=f"${ENV_PASSWORD}; default: the local deployment's passwords file")
    parser.add_argument("--dag", default=default(DEFAULT_DAG), help=f"the training DAG (default {DEFAULT_DAG})")


def _follow_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-follow", action="store_true", help="print the run id(s) and return at once")
    parser.add_argument("--poll-interval", type=float, default=5.0, metavar="S", help="seconds between polls (5)")
    parser.add_argument("--timeout", type=float, default=0.0, metavar="S",
                        help="stop following after S seconds (exit 1; the runs go on); 0: never (default)")
    parser.add_argument("--wait-for-dag", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds for Airflow to know the DAG (a freshly started Airflow)")


def _conf_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conf-file", metavar="FILE.json", help="the run conf, a JSON object ('-': stdin)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a conf key; VALUE is JSON when it parses (4, true, [1,2]), else a string; repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ultracluster", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _connection_options(parser, defaults=True)
    shared = argparse.ArgumentParser(add_help=False)
    _connection_options(shared, defaults=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trigger = commands.add_parser("trigger", parents=[shared], help="trigger a run and follow it task by task")
    _conf_options(trigger)
    _follow_options(trigger)
    trigger.add_argument("--results", default="collect_results", metavar="TASK",
                         help="after the run, print this task's return value (default collect_results; '' for none)")
    trigger.set_defaults(handler=cmd_trigger)

    status = commands.add_parser("status", parents=[shared], help="a run's state and its tasks' states")
    status.add_argument("run_id", metavar="RUN_ID")
    status.set_defaults(handler=cmd_status)

    sweep = commands.add_parser("sweep", parents=[shared], help="one run per node count (fan-out or backfill)")
    sweep.add_argument("--id", required=True, help="the sweep id (lowercase letters, digits, '-')")
    sweep.add_argument("--nodes", required=True, metavar="N,N,...", help="the node counts, e.g. 1,2,4")
    sweep.add_argument("--mode", choices=("strong", "weak"), default="strong", help="scaling mode (strong)")
    sweep.add_argument("--via", choices=("runs", "backfill"), default="runs",
                       help="runs: one manual run per point (default); backfill: the last len(points) weekly ticks")
    sweep.add_argument("--max-active", type=int, default=1, metavar="N", help="backfill: runs at a time (1)")
    sweep.add_argument("--dry-run", action="store_true", help="backfill: print the planned runs, create nothing")
    sweep.add_argument("--network", choices=("shared", "per-run"), default="shared",
                       help="shared: one network for every point, made and deleted by trn1_sweep_network "
                            "(default); per-run: each run makes its own")
    sweep.add_argument("--cluster", choices=("own", "shared"), default="own",
                       help="own: each point makes its own cluster (default); shared: every point trains on one "
                            "cluster, sized to the largest point, made and deleted by trn1_sweep_cluster")
    _conf_options(sweep)
    _follow_options(sweep)
    sweep.set_defaults(handler=cmd_sweep)

    report = commands.add_parser("report", parents=[shared], help="build a sweep's scaling report and print it")
    report.add_argument("sweep_id", metavar="SWEEP_ID")
    report.add_argument("--partial", action="store_true", help="report the runs that ended so far")
    report.add_argument("--report-dag", default=REPORT_DAG, help=f"the report DAG (default {REPORT_DAG})")
    _follow_options(report)
    report.set_defaults(handler=cmd_report)

    add_reap_parser(commands, shared)
    return parser


def main(argv: list[str] | None = None, *, now: datetime | None = None) -> int:
    """The console script. ``now`` (tests) fixes the clock that picks a backfilled sweep's dates."""
    args = build_parser().parse_args(argv)
    files = [] if args.password else passwords_files(checkout=checkout_root())
    password = args.password or local_password(args.username, files)
    client = AirflowClient(args.url, args.username, password, looked_in=files)
    try:
        if args.handler is cmd_sweep:
            return cmd_sweep(client, args, now)
        return args.handler(client, args)
    except CliError as exc:
        print(f"ultracluster: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("ultracluster: interrupted; the runs go on (`ultracluster status RUN_ID` shows one)",
              file=sys.stderr, flush=True)
        return 130
    finally:
        client.close()
