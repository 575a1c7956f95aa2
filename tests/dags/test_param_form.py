"""The trigger form's view of the params, in every profile: with the defaults the Trigger button must be
enabled, and the form must read well (titles, descriptions, sections, drop-downs, examples).

Airflow 3.3's form (``FlexibleForm``, ``isParamRequired``) receives each param as the REST API dumps it
(``{"value", "schema", "description"}``, after a scheduler serialization round trip; a default that
fails its schema is shown as null). It marks a param
required when ``schema.type`` is set and does not include ``"null"``, and flags its section (which
disables Trigger) while a required value is null, undefined or "". The server then validates each value
against its schema.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ultracluster.params import dag_params
from ultracluster.run.form import SECTIONS
from ultracluster.run.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted(p.stem for p in (REPO / "include" / "profiles").glob("*.json"))


def form_view(params: dict) -> dict[str, dict[str, Any]]:
    """What the UI receives: the DAG serialized as the scheduler stores it, params dumped as the API does."""
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("form_view", schedule=None, params=params) as dag:
        pass
    restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    return {name: {**param.dump(), "default": param.value} for name, param in restored.params.items()}


def is_required(spec: dict[str, Any]) -> bool:
    kind = spec["schema"].get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def form_problems(view: dict[str, dict[str, Any]]) -> list[str]:
    """Why the Trigger button would be disabled, or the server would refuse the defaults."""
    import jsonschema

    problems = []
    for name, spec in view.items():
        value = spec["value"]
        if is_required(spec) and value in (None, ""):
            problems.append(f"{name}: required (type {spec['schema']['type']!r}) but the form shows {value!r}")
            continue
        if value != spec["default"]:  # the API shows null for a default that fails its schema
            problems.append(f"{name}: the form shows {value!r}, not the default {spec['default']!r}")
            continue
        try:
            jsonschema.validate(value, spec["schema"], format_checker=jsonschema.FormatChecker())
        except jsonschema.ValidationError as err:
            problems.append(f"{name}: default {value!r} fails its schema: {err.message}")
    return problems


@pytest.fixture(params=PROFILES)
def profile(request, monkeypatch) -> dict[str, Any]:
    # A profile's ${VAR:-fallback} must be judged by its fallbacks, not this machine's environment.
    import os

    for key in [k for k in os.environ if k.startswith("ULTRACLUSTER_")]:
        monkeypatch.delenv(key)
    return load_profile(request.param)


def test_both_profiles_are_checked():
    assert {"local", "production"} <= set(PROFILES)


def test_every_default_keeps_the_trigger_button_enabled(profile):
    assert form_problems(form_view(dag_params(profile))) == []


@pytest.mark.parametrize("param, problem", [
    ({"type": "string"}, "required"),                    # the original bug: "" in a required string
    ({"type": "string", "pattern": "^s3://"}, "required"),
    ({"type": ["null", "string"], "pattern": "^s3://.+"}, "the form shows None"),  # "" is not null
])
def test_the_check_sees_a_disabled_trigger_button(param, problem):
    from airflow.sdk import Param

    problems = form_problems(form_view({"x": Param("", **param)}))
    assert len(problems) == 1 and problem in problems[0], problems


def test_an_optional_value_is_null_by_default_and_not_required(profile):
    view = form_view(dag_params(profile))
    optional = [name for name, spec in view.items() if not is_required(spec)]
    assert "compile_cache_s3_uri" in optional and "cluster_name" in optional
    for name in optional:
        assert view[name]["value"] is None, name


def test_the_form_reads_well(profile):
    view = form_view(dag_params(profile))
    seen_sections = []
    for name, spec in view.items():
        schema = spec["schema"]
        assert schema.get("title") and schema["title"] != name, f"{name}: no title"
        assert spec["description"] and len(spec["description"]) > 20, f"{name}: no description"
        assert schema.get("section") in SECTIONS, f"{name}: section {schema.get('section')!r}"
        if schema["section"] not in seen_sections:
            seen_sections.append(schema["section"])
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if "array" in kinds or "object" in kinds:
            assert "Example: " in spec["description"], f"{name}: show an example"
            # `examples` on an array would turn the field into a multi-select of those examples.
            assert "examples" not in schema, name
        if "enum" in schema:  # a drop-down: the UI does so for string/number/integer enums
            assert set(kinds) & {"string", "integer", "number"}, name
            assert spec["value"] in schema["enum"], name
    # Each section is one block in the form, in the declared order.
    assert seen_sections == list(SECTIONS)
    names = list(view)
    assert names == sorted(names, key=lambda n: SECTIONS.index(view[n]["schema"]["section"]))


def test_the_dag_uses_these_params():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["trn1_bert_pretrain"]
    assert list(dag.params) == list(dag_params(load_profile()))
