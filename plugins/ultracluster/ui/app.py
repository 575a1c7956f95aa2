"""The plugin's FastAPI app, mounted by the API server at ``/ultracluster`` (ui/plugin.py).

    GET /ultracluster/reports                              the reported sweeps
    GET /ultracluster/reports/{dag_id}/{sweep_id}          one report: summary, plot, table, notes
    GET /ultracluster/reports/{dag_id}/{sweep_id}/plot.png its plot (image/png)
    GET /ultracluster/jobs/{dag_id}/{run_id}/{task_id}     a Slurm task's job: id, state, log path

A plugin's app is not behind Airflow's login by itself. Here every route depends on Airflow's own
security dependencies (airflow.api_fastapi.core_api.security): the app-wide ``requires_authenticated``
(the UI's ``_token`` cookie, or ``Authorization: Bearer`` with a token from ``POST /auth/token``;
none: 401), and per route the auth manager's DAG permission (403 without it). The app has no
OpenAPI or docs routes, which would not run those dependencies.

The reports come from the deployment's artifacts bucket: the profile's ``artifacts_s3_uri`` (as the
report DAG's default) read with the ``aws_default`` connection.
"""
from __future__ import annotations

from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag, requires_authenticated
from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from fastapi import Depends, FastAPI, Path, Request
from fastapi.exceptions import HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ultracluster.run.profiles import load_profile
from ultracluster.run.sweep import SWEEP_ID_PATTERN
from ultracluster.ui import pages
from ultracluster.ui.jobs import RUN_ID_PATTERN, TASK_ID_PATTERN, job_facts
from ultracluster.ui.reports import DAG_ID_PATTERN, ReportsUnavailable, list_reports, read_plot, read_report

DagId = Annotated[str, Path(pattern=DAG_ID_PATTERN)]
SweepId = Annotated[str, Path(pattern=SWEEP_ID_PATTERN)]
RunId = Annotated[str, Path(pattern=RUN_ID_PATTERN)]
TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN)]
_REPORT_ACCESS = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]
_JOB_ACCESS = [Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)),
               Depends(requires_access_dag("GET", DagAccessEntity.XCOM))]


def _artifacts(request: Request) -> str:
    configured = request.app.state.artifacts_s3_uri
    if configured:
        return configured

    return load_profile()["artifacts_s3_uri"]


def _s3(request: Request) -> Any:
    return S3Hook(aws_conn_id=request.app.state.aws_conn_id)


def _html(body: str, status_code: int = 200) -> HTMLResponse:
    # The pages run no script and load nothing from elsewhere; frames only from the same origin (the UI).
    return HTMLResponse(body, status_code=status_code, headers={
        "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
                                   "frame-ancestors 'self'",
        "Cache-Control": "no-store"})


def _unavailable(err: ReportsUnavailable) -> HTMLResponse:
    return _html(pages.message_page("Reports unavailable", str(err)), 502)


def _can_read_runs(user: Any, dag_id: str) -> bool:
    """The auth manager's verdict, as requires_access_dag asks it for one DAG's runs."""
    from airflow.api_fastapi.app import get_auth_manager  # server-side (docs/architecture.md, "Imports")
    from airflow.models.dag import DagModel

    return get_auth_manager().is_authorized_dag(
        method="GET", access_entity=DagAccessEntity.RUN,
        details=DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id)), user=user)


def create_app(*, artifacts_s3_uri: str | None = None, aws_conn_id: str = "aws_default") -> FastAPI:
    """The app; ``artifacts_s3_uri`` None: the profile's, read on each request."""
    app = FastAPI(title="ultracluster", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(requires_authenticated())])
    app.state.artifacts_s3_uri = artifacts_s3_uri
    app.state.aws_conn_id = aws_conn_id

    @app.exception_handler(StarletteHTTPException)
    async def refused(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code not in (401, 403):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        # A page, not JSON: whoever opened it in a browser gets a way to sign in.
        from airflow.api_fastapi.app import get_auth_manager

        login = get_auth_manager().get_url_login(next_url=str(request.url))
        return _html(pages.message_page("Sign in to Airflow" if exc.status_code == 401 else "Not allowed",
                                        str(exc.detail), link=(login, "Sign in")), exc.status_code)

    @app.get("/reports", response_class=HTMLResponse)
    def reports_index(request: Request, user: GetUserDep) -> HTMLResponse:
        uri = _artifacts(request)
        try:
            entries = list_reports(_s3(request), uri)
        except ReportsUnavailable as err:
            return _unavailable(err)
        readable = {dag_id for dag_id in {e["dag_id"] for e in entries} if _can_read_runs(user, dag_id)}
        return _html(pages.reports_list([e for e in entries if e["dag_id"] in readable],
                                        f"{uri.rstrip('/')}/reports/"))

    @app.get("/reports/{dag_id}/{sweep_id}", response_class=HTMLResponse, dependencies=_REPORT_ACCESS)
    def report(request: Request, dag_id: DagId, sweep_id: SweepId) -> HTMLResponse:
        try:
            found = read_report(_s3(request), _artifacts(request), dag_id, sweep_id)
        except ReportsUnavailable as err:
            return _unavailable(err)
        if found is None:
            return _html(pages.message_page("No such report", f"No report of sweep {sweep_id} of {dag_id}."), 404)
        try:
            return _html(pages.report_page(found, dag_id, sweep_id))
        except (KeyError, TypeError, ValueError) as err:  # a report.json of another shape
            return _html(pages.message_page("Unreadable report", f"report.json of sweep {sweep_id} of {dag_id} "
                                            f"lacks what the page shows ({type(err).__name__}: {err})."), 502)

    @app.get("/reports/{dag_id}/{sweep_id}/plot.png", dependencies=_REPORT_ACCESS,
             responses={200: {"content": {"image/png": {}}}})
    def plot(request: Request, dag_id: DagId, sweep_id: SweepId) -> Response:
        try:
            png = read_plot(_s3(request), _artifacts(request), dag_id, sweep_id)
        except ReportsUnavailable as err:
            raise HTTPException(502, str(err)) from err
        if png is None:
            raise HTTPException(404, f"No plot of sweep {sweep_id} of {dag_id}")
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/jobs/{dag_id}/{run_id}/{task_id}", response_class=HTMLResponse, dependencies=_JOB_ACCESS)
    def job(dag_id: DagId, run_id: RunId, task_id: TaskId, session: SessionDep) -> HTMLResponse:
        facts = job_facts(session, dag_id, run_id, task_id)
        if facts is None:
            return _html(pages.message_page("No such task", f"No task {task_id} in run {run_id} of {dag_id}."), 404)
        return _html(pages.job_page(facts))

    return app
