"""The `ultracluster` command: a client of Airflow's REST API v2 (docs/client.md)."""
from ultracluster.cli.main import main

__all__ = ["main"]
