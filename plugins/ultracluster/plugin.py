"""The Airflow plugin: registers ultracluster's operator extra links with the webserver/API."""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from ultracluster.links import ALL_LINKS


class UltraClusterPlugin(AirflowPlugin):
    name = "ultracluster"
    operator_extra_links = list(ALL_LINKS)
