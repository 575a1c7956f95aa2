"""The ultracluster pages in the Airflow UI (an Airflow plugin, registered by an entry point).

- ``plugin.UltraClusterPlugin``: the plugin (``airflow.plugins`` entry point in plugins/pyproject.toml).
- ``app``: the FastAPI app the API server mounts at ``/ultracluster``: the scaling reports and the
  Slurm job page. Every route requires Airflow's authentication.
- ``reports``: reading the reports from the artifacts bucket; ``jobs``: a Slurm task's facts from
  the metadata DB; ``pages``: the HTML (everything escaped).

Every Airflow process loads the plugin; the app and its server-side imports load in the API server.
"""
