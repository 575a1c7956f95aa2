"""build_report: a sweep's scaling report, from its sweep index in S3 and its runs' XComs, to S3.

Reads ``<artifacts>/sweeps/<source dag>/<sweep id>/runs/*.json`` (written by the pipeline's
preflight), each run's state and XComs, and writes ``report.md``, ``report.html``, ``report.json``
and ``throughput.png`` to ``<artifacts>/reports/<source dag>/<sweep id>/``.

The pipeline's results Asset event comes from collect_results, before the cluster is deleted: the
triggering run is still running then. When only such teardowns are pending, the task defers (no
worker slot) and looks again, up to ``teardown_wait`` seconds, so the report has their wall times.
A sweep on one cluster waits the same way for its holder's bill of the cluster (written when the
holder deletes it after the last point), so its Shared cluster line has the overhead.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.dag_runs import get_dagrun_state
from ultracluster.links import SweepReportLink
from ultracluster.report.plot import plot_png
from ultracluster.report.records import XCOM_TASKS, run_record
from ultracluster.report.render import render_html, render_markdown, report_json
from ultracluster.report.table import make_report
from ultracluster.run.clock import parse_time
from ultracluster.run.cost import load_prices
from ultracluster.run.s3 import check_sse
from ultracluster.run.shared_cluster import cluster_name, usage_key
from ultracluster.run.sweep import index_uri, on_held, read_index, sweep_location

if TYPE_CHECKING:
    from airflow.sdk import Context

DEFAULT_SOURCE_DAG_ID = "trn1_bert_pretrain"
FILES = {"report.md": "text/markdown; charset=utf-8", "report.html": "text/html; charset=utf-8",
         "report.json": "application/json", "throughput.png": "image/png"}
# collect_results' artifacts_uri: <artifacts>/results/<dag id>/<run slug>/
_RESULTS_URI = re.compile(r"^(s3://.+?)/results/[^/]+/[^/]+/?$")

StateLookup = Callable[[str, str], Any]
XComLookup = Callable[[Any, str, str], dict[str, Any]]


def requested_sweeps(params: Mapping[str, Any], events: Mapping[Any, Sequence[Any]] | None) -> dict[str, str | None]:
    """Sweep id -> artifacts root to read it from (None: the ``artifacts_s3_uri`` param). The
    ``sweep_id`` param wins; else every sweep named by the triggering results events."""
    if params.get("sweep_id"):
        return {str(params["sweep_id"]): None}
    sweeps: dict[str, str | None] = {}
    for asset_events in (events or {}).values():
        for event in asset_events:
            extra = getattr(event, "extra", None) or {}
            sweep = extra.get("sweep") if isinstance(extra, Mapping) else None
            if isinstance(sweep, Mapping) and sweep.get("id"):
                # A run with its own artifacts_s3_uri indexed its sweep there, not under the default.
                match = _RESULTS_URI.match(str(extra.get("artifacts_uri") or ""))
                sweeps[str(sweep["id"])] = match.group(1) if match else None
    return sweeps


def unbilled(report: Mapping[str, Any]) -> bool:
    """A sweep on one cluster whose holder has not billed the cluster yet (it bills it on deleting it,
    after the last point ended): the report's Shared cluster line has no overhead then."""
    shared = report.get("shared_cluster")
    return bool(shared) and shared.get("overhead") is None


def waitable(report: Mapping[str, Any]) -> bool:
    """What keeps a report back will pass by itself: only teardowns, or only the holder's bill."""
    pending = report["pending"]
    return all(p["tearing_down"] for p in pending) if pending else unbilled(report)


def run_xcoms(ti: Any, dag_id: str, run_id: str) -> dict[str, Any]:
    """The return values of the source run's tasks that feed a run record."""
    return {task_id: ti.xcom_pull(dag_id=dag_id, run_id=run_id, task_ids=task_id) for task_id in XCOM_TASKS}


class ScalingReportOperator(BaseOperator):
    """Build a sweep's scaling report (docs/report.md).

    Reads the DAG params ``sweep_id``, ``partial``, ``source_dag_id``, ``artifacts_s3_uri``. Skips
    when there is no sweep to report, or (``partial`` false) while a point has not ended. Returns
    ``{"sweep_id", "uri", "markdown", "rows", "reports"}``; with several sweeps (several triggering
    events) ``markdown`` holds every report, the other keys are the last one's and ``reports``
    lists each ``{"sweep_id", "uri"}``. Each outlet gets ``{"sweep_id", "uri"}`` as its event extra.

    :param aws_conn_id: S3Hook connection.
    :param s3_encryption: server-side encryption of the report's files (``run.s3.sse_args``).
    :param poll_interval: seconds between looks while runs tear down.
    :param teardown_wait: seconds to wait at most for teardowns (and a shared cluster's bill), then skip
        (or report, if partial).
    :param state_lookup: ``(dag_id, run_id) -> state``; default: the API server's.
    :param xcom_lookup: ``(ti, dag_id, run_id) -> {task_id: value}``; default: ``ti.xcom_pull``.
    """
    ui_color = "#d5f5e3"
    operator_extra_links = (SweepReportLink(),)

    def __init__(self, *, aws_conn_id: str | None = "aws_default", poll_interval: float = 60,
                 teardown_wait: float = 3600, state_lookup: StateLookup | None = None,
                 xcom_lookup: XComLookup | None = None, s3_encryption: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.s3_encryption = check_sse(s3_encryption)
        self.aws_conn_id = aws_conn_id
        self.poll_interval = poll_interval
        self.teardown_wait = teardown_wait
        self.state_lookup = state_lookup or get_dagrun_state
        self.xcom_lookup = xcom_lookup or run_xcoms

    def execute(self, context: Context, event: Any = None, waiting_since: str | None = None) -> dict[str, Any]:
        params = context["params"]
        source = params.get("source_dag_id") or DEFAULT_SOURCE_DAG_ID
        sweeps = requested_sweeps(params, context.get("triggering_asset_events"))
        if not sweeps:
            raise AirflowSkipException("No sweep to report: set the sweep_id param, or trigger from a results "
                                       "event of a sweep run (its extra 'sweep' is null outside sweeps)")
        s3, prices = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption), load_prices()
        reports, skipped, waiting = [], {}, []
        for sweep_id, root in sweeps.items():
            root = root or params["artifacts_s3_uri"]
            report, why = self._report(context["ti"], s3, root, source, sweep_id, prices, bool(params.get("partial")))
            if why:
                skipped[sweep_id] = why
                if waitable(report):
                    waiting.append(sweep_id)
            else:
                reports.append((root, report))
        started = parse_time(waiting_since) or datetime.now(timezone.utc)
        if waiting and datetime.now(timezone.utc) - started < timedelta(seconds=self.teardown_wait):
            # Linked before the wait: the sweep's page shows its last report, and this one when written.
            SweepReportLink.persist(context, dag_id=source, sweep_id=waiting[-1])
            self._wait(waiting, started)
        for sweep_id, why in skipped.items():
            self.log.warning("Sweep %s: no report: %s", sweep_id, why)
        if not reports:
            raise AirflowSkipException("; ".join(f"sweep {s}: {why}" for s, why in skipped.items()))
        return self._publish(context, s3, source, reports)

    def _report(self, ti: Any, s3: Any, root: str, source: str, sweep_id: str, prices: dict[str, Any],
                partial: bool) -> tuple[dict[str, Any], str | None]:
        """The sweep's report, and why not to publish it (None: publish)."""
        entries = read_index(s3, root, source, sweep_id, self.log)
        records = [run_record(e, self.state_lookup(e.get("dag_id") or source, e["run_id"]),
                              self.xcom_lookup(ti, e.get("dag_id") or source, e["run_id"])) for e in entries]
        # The newest index entry has the sweep's current list of points.
        points = next((e["point"]["points"] for e in reversed(entries) if (e.get("point") or {}).get("points")), [])
        report = make_report(sweep_id, source, points, records, prices, partial=partial,
                             shared_cluster=self._shared_cluster(s3, root, source, sweep_id, entries))
        if not entries:
            return report, f"no runs indexed under {index_uri(root, source, sweep_id)}"
        if report["pending"] and not partial:
            waiting = ", ".join(f"{p['nodes']} nodes {p['status']}" + (" (tearing down)" if p["tearing_down"] else "")
                                for p in report["pending"])
            return report, f"not every point has ended (pending: {waiting}); set partial to report anyway"
        if unbilled(report) and not partial:
            return report, (f"shared cluster {report['shared_cluster']['cluster_name']} not billed yet (its holder "
                            "bills it when it deletes it, after the last point); set partial to report anyway")
        return report, None

    def _shared_cluster(self, s3: Any, root: str, source: str, sweep_id: str,
                        entries: list[dict[str, Any]]) -> dict[str, Any] | None:
        """A sweep on one cluster: its name and the holder's bill of it (None until it is deleted)."""
        name = cluster_name(sweep_id)
        if not on_held(entries, None, name):
            return None
        bucket, prefix = sweep_location(root, "sweeps", source, sweep_id)
        key = usage_key(prefix)
        usage = json.loads(s3.read_key(key, bucket_name=bucket)) if s3.check_for_key(key, bucket_name=bucket) else None
        if usage is None:
            self.log.info("Sweep %s trained on shared cluster %s, not billed yet (s3://%s/%s missing)",
                          sweep_id, name, bucket, key)
        return {"cluster_name": name, "usage": usage}

    def _wait(self, sweeps: list[str], started: datetime) -> None:
        self.log.info("Sweep(s) %s: the last runs are deleting their clusters, or the shared cluster's holder; "
                      "looking again in %s s "
                      "(waiting since %s, at most %s s)", sweeps, self.poll_interval, started.isoformat(),
                      self.teardown_wait)
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.poll_interval)), method_name="execute",
                   kwargs={"waiting_since": started.isoformat()})

    def _publish(self, context: Context, s3: Any, source: str,
                 reports: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        published = []
        for root, report in reports:
            bucket, prefix = sweep_location(root, "reports", source, report["sweep_id"])
            png, markdown = plot_png(report), render_markdown(report)
            bodies = {"report.md": markdown.encode(), "report.html": render_html(report, png).encode(),
                      "report.json": report_json(report).encode(), "throughput.png": png}
            for name, body in bodies.items():
                s3.put_object(bucket, f"{prefix}/{name}", body, FILES[name])
            uri = f"s3://{bucket}/{prefix}/"
            self.log.info("Scaling report of sweep %s: %s\n%s", report["sweep_id"], uri, markdown)
            published.append({"sweep_id": report["sweep_id"], "uri": uri, "markdown": markdown,
                              "rows": report["rows"]})
        last = published[-1]
        SweepReportLink.persist(context, dag_id=source, sweep_id=last["sweep_id"])
        for asset in self.outlets or []:
            context["outlet_events"][asset].extra = {"sweep_id": last["sweep_id"], "uri": last["uri"]}
        return {**last, "markdown": "\n".join(p["markdown"] for p in published),
                "reports": [{"sweep_id": p["sweep_id"], "uri": p["uri"]} for p in published]}
