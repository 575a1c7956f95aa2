"""load_profile: profile selection, ${VAR} expansion, errors."""
from __future__ import annotations

import json

import pytest

from ultracluster.run.profiles import ProfileError, include_dir, load_profile

REPO = include_dir().parent


@pytest.fixture
def profiles_dir(tmp_path, monkeypatch):
    (tmp_path / "profiles").mkdir()
    monkeypatch.setenv("ULTRACLUSTER_INCLUDE_DIR", str(tmp_path))
    return tmp_path / "profiles"


def test_production_is_the_default(monkeypatch):
    monkeypatch.delenv("ULTRACLUSTER_PROFILE", raising=False)
    profile = load_profile()
    assert (profile["num_nodes"], profile["instance_type"], profile["scaling_mode"]) == (16, "trn1.32xlarge", "strong")
    assert profile["dataset_s3_uri"].endswith("bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar")


def test_environment_selects_the_local_profile(monkeypatch):
    monkeypatch.setenv("ULTRACLUSTER_PROFILE", "local")
    profile = load_profile()
    assert (profile["num_nodes"], profile["model_size"]) == (2, "tiny")
    assert profile["artifacts_s3_uri"].startswith("s3://ultracluster-artifacts")


def test_both_shipped_profiles_have_the_same_keys():
    assert set(load_profile("production")) == set(load_profile("local"))
    assert not any(key.startswith("_") for key in load_profile("production"))


def test_expansion_with_fallbacks(profiles_dir, monkeypatch):
    (profiles_dir / "p.json").write_text(json.dumps({
        "set": "${UC_TEST_SET}", "fallback": "${UC_TEST_UNSET:-s3://fallback}", "inner": "a/${UC_TEST_SET}/b",
        "nested": {"list": ["${UC_TEST_SET}", 3]}, "number": 5, "_comment": "dropped",
    }))
    monkeypatch.setenv("UC_TEST_SET", "value")
    monkeypatch.delenv("UC_TEST_UNSET", raising=False)
    assert load_profile("p") == {"set": "value", "fallback": "s3://fallback", "inner": "a/value/b",
                                 "nested": {"list": ["value", 3]}, "number": 5}


def test_unset_variable_without_fallback_is_an_error(profiles_dir, monkeypatch):
    (profiles_dir / "p.json").write_text(json.dumps({"bucket": "${UC_TEST_UNSET}"}))
    monkeypatch.delenv("UC_TEST_UNSET", raising=False)
    with pytest.raises(ProfileError, match="UC_TEST_UNSET is not set"):
        load_profile("p")


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing", None, "not found"),
    ("broken", "{not json", "not valid JSON"),
    ("array", "[1, 2]", "JSON object"),
    ("../etc/passwd", None, "Invalid profile name"),
])
def test_bad_profiles_fail_clearly(profiles_dir, name, content, message):
    if content is not None:
        (profiles_dir / f"{name}.json").write_text(content)
    with pytest.raises(ProfileError, match=message):
        load_profile(name)


def test_include_dir_points_at_the_repository_include():
    assert (include_dir() / "cluster" / "vpc.yaml").is_file()


def test_the_docs_profile_table_matches_the_profile_files():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "scripts" / "profile_table.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
