"""ultracluster registers itself as an Airflow provider (entry point ``apache_airflow_provider``)."""
from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

from ultracluster.get_provider_info import get_provider_info


def test_provider_info_matches_airflows_schema():
    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_every_registered_module_and_class_imports():
    info = get_provider_info()
    modules = [m for key in ("operators", "sensors", "hooks", "triggers") for group in info[key]
               for m in group["python-modules"]]
    assert "ultracluster.triggers.slurm" in modules
    for module in modules:
        importlib.import_module(module)
    for dotted in info["extra-links"] + [c["hook-class-name"] for c in info["connection-types"]]:
        module, _, name = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), name), dotted


def test_the_entry_points_are_installed():
    [entry] = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("ultracluster.")]
    assert entry.load() is get_provider_info
    # The plugin (ui/plugin.py): the run note's listener and the pages; the links need no plugin.
    from ultracluster.listeners import run_note_listener
    from ultracluster.ui.plugin import UltraClusterPlugin

    [plugin] = [e for e in entry_points(group="airflow.plugins") if e.value.startswith("ultracluster.")]
    assert plugin.load() is UltraClusterPlugin and UltraClusterPlugin.listeners == [run_note_listener]


def test_airflow_sees_the_pcluster_connection_type_and_the_links():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "ultracluster" in manager.providers
    hook = manager.hooks["pcluster"]
    assert hook.hook_class_name == "ultracluster.hooks.parallelcluster.ParallelClusterHook"
    assert hook.connection_type == "pcluster" and hook.hook_name == "AWS ParallelCluster CLI"
    widgets = manager.connection_form_widgets
    assert {"extra__pcluster__binary", "extra__pcluster__region"} <= set(widgets)
    assert "host" in manager.field_behaviours["pcluster"]["hidden_fields"]
    assert "ultracluster.links.S3ResultsLink" in manager.extra_links_class_names


def test_the_hook_declares_the_same_connection_type():
    from ultracluster.hooks.parallelcluster import ParallelClusterHook

    [conn_type] = get_provider_info()["connection-types"]
    assert ParallelClusterHook.conn_type == conn_type["connection-type"]
    assert ParallelClusterHook.hook_name == conn_type["hook-name"]
