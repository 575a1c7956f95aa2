"""The ultracluster Airflow plugin: the "Scaling reports" page (Browse menu) and the Slurm job page.

Registered by the ``airflow.plugins`` entry point of plugins/pyproject.toml (the deployment's plugins
folder stays empty). Every Airflow process loads plugins, so this module imports nothing heavy: the
FastAPI app is built the first time the API server asks for ``fastapi_apps``.
"""
from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from ultracluster.listeners import run_note_listener

URL_PREFIX = "/ultracluster"
REPORTS_URL_ROUTE = "scaling-reports"


@cache
def _fastapi_apps() -> list[dict[str, Any]]:
    from ultracluster.ui.app import create_app

    return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "ultracluster"}]


class UltraClusterPlugin(AirflowPlugin):
    name = "ultracluster"

    # The run note: when a pipeline run ends, the scheduler writes its summary into the run's note.
    listeners = [run_note_listener]

    # In the nav's Browse menu. With a url_route the UI shows the page in a frame at
    # /plugin/scaling-reports. href is relative to the UI's <base href> (the API server's base URL),
    # so it also works when Airflow is served under a path.
    external_views = [
        {
            "name": "Scaling reports",
            "href": f"{URL_PREFIX.lstrip('/')}/reports",
            "destination": "nav",
            "category": "browse",
            "url_route": REPORTS_URL_ROUTE,
        }
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return _fastapi_apps()
