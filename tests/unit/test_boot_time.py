"""run.boot_time: the checked-in boot-steps table (every figure sourced or an assumption), the sum for
an instance type and a node count, the NAT gateway's share, and the 70 % warning."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from ultracluster.run import boot_time
from ultracluster.run.boot_time import (INSTALL_AT_BOOT, PREBUILT_IMAGE, BootTableError, boot_warning, describe, estimate,
                                        load_boot_steps, nodes_at_once)
from ultracluster.run.profiles import include_dir, load_profile

REPO = Path(__file__).resolve().parents[2]
TABLE = load_boot_steps()


def table_with(tmp_path: Path, change) -> Path:
    raw = json.loads(boot_time.boot_steps_path().read_text())
    change(raw)
    path = tmp_path / "boot-steps.json"
    path.write_text(json.dumps(raw))
    return path


# --- the table ------------------------------------------------------------------------------------

def test_every_row_has_a_source_or_is_an_assumption_with_its_reasoning():
    for step in TABLE["steps"]:
        sourced, assumed = bool(step.get("source")), step.get("assumption") is True
        assert sourced != assumed, step["id"]
        assert step.get("reasoning") if assumed else "reasoning" not in step, step["id"]
        assert step.get("what"), step["id"]


def test_the_sources_cite_something_checkable():
    """A source is a URL, an issue or pull request, a path in the pinned package or the repo, or a
    measurement that says what was measured."""
    checkable = re.compile(r"https://|issue #|pull request #|pcluster/|include/|measured")
    for step in TABLE["steps"]:
        if step.get("source"):
            assert checkable.search(step["source"]), step["id"]


@pytest.mark.parametrize("change, message", [
    (lambda t: t["steps"][0].pop("source"), "needs a 'source', or 'assumption'"),
    (lambda t: t["steps"][0].update(assumption=True, reasoning="x"), "one of them"),
    (lambda t: t["steps"][2].pop("reasoning"), "needs a 'source', or 'assumption'"),
    (lambda t: t["steps"][0].update(download_mb=5), "exactly one of 'seconds' or 'download_mb'"),
    (lambda t: t["steps"][0].update(seconds=-1), "must be a number >= 0"),
    (lambda t: t["steps"][0].update(phase="elsewhere"), "is in no row set"),
    (lambda t: t["steps"].append(copy.deepcopy(t["steps"][0])), "the id is used twice"),
    (lambda t: t["bootstrap_timeout"].pop("source"), "bootstrap_timeout needs a 'source'"),
    (lambda t: t["network"]["nat_gateway_mb_per_s"].update(value=0), "must be > 0"),
    (lambda t: t.pop("row_sets"), "missing or malformed"),
])
def test_a_table_that_breaks_the_rules_is_refused(tmp_path, change, message):
    with pytest.raises(BootTableError, match=re.escape(message)):
        load_boot_steps(table_with(tmp_path, change))


def test_the_table_can_be_moved_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(boot_time.BOOT_STEPS_ENV_VAR, str(table_with(tmp_path, lambda t: None)))
    assert load_boot_steps()["file"] == str(tmp_path / "boot-steps.json")
    monkeypatch.setenv(boot_time.BOOT_STEPS_ENV_VAR, str(tmp_path / "none.json"))
    with pytest.raises(BootTableError, match="Cannot read the boot-steps table"):
        load_boot_steps()


def test_the_timeout_is_the_pinned_parallelclusters_default():
    """NODE_BOOTSTRAP_TIMEOUT of aws-parallelcluster 3.16.1 (.venvs/pcluster), which the cluster config
    does not override."""
    assert TABLE["bootstrap_timeout"]["seconds"] == 2100
    constants = sorted(REPO.glob(".venvs/pcluster/lib/python3*/site-packages/pcluster/constants.py"))
    if constants:
        assert re.search(r"^NODE_BOOTSTRAP_TIMEOUT = 2100$", constants[0].read_text(), re.MULTILINE)
    assert "ComputeNodeBootstrapTimeout" not in (include_dir() / "cluster" / "cluster-config.yaml.j2").read_text()


def test_the_pip_rows_cover_every_pinned_package_and_the_apt_rows_every_apt_package():
    """A pin added to include/neuron-versions.env needs its row (the Neuron repo's own packages share two)."""
    text = json.dumps(TABLE["steps"]).lower()
    versions = (include_dir() / "neuron-versions.env").read_text()
    pips = re.search(r'^NEURON_PIP_PACKAGES="([^"]*)"', versions, re.MULTILINE).group(1).split()
    apts = re.search(r'^NEURON_APT_PACKAGES="([^"]*)"', versions, re.MULTILINE).group(1).split()
    for spec in pips + apts:
        name = re.split(r"==|=", spec)[0]
        assert name.lower() in text, f"{name}: no row of include/cluster/boot-steps.json names it"


# --- the estimate ---------------------------------------------------------------------------------

def by_hand(nodes: int, *, prebuilt: bool = False, instance_type: str = "trn1.32xlarge") -> float:
    phases = TABLE["row_sets"][PREBUILT_IMAGE if prebuilt else INSTALL_AT_BOOT]
    rate = min(44.0, 625.0 / nodes)
    total = 0.0
    for step in TABLE["steps"]:
        if step["phase"] in phases:
            total += (step["download_mb"] / rate if "download_mb" in step
                      else step.get("seconds_by_instance_type", {}).get(instance_type, step["seconds"]))
    return total


def test_sixteen_trn1_32xlarge_nodes_installing_neuron_at_boot():
    """The production profile's run: 16 nodes, all dynamic, ParallelCluster's own image."""
    boot = estimate(TABLE, instance_type="trn1.32xlarge", nodes=16, prebuilt=False)
    assert boot["seconds"] == round(by_hand(16)) == 752
    assert boot["timeout_s"] == 2100 and boot["share"] == pytest.approx(752 / 2100, abs=1e-3)
    assert boot["nat_limited"] and boot["mb_per_s"] == pytest.approx(625 / 16, abs=0.05)
    assert boot_warning(boot, 0.7) is None
    assert describe(boot) == (
        "node boot estimate: 752 s for 16 × trn1.32xlarge booting at once with the Neuron stack installed at "
        "boot; 5062 MB each at 39.1 MB/s (the NAT gateway shared by 16 nodes): 35.8% of the 2100 s "
        "compute-node bootstrap timeout")


def test_a_prebuilt_image_is_only_parallelclusters_own_start():
    boot = estimate(TABLE, instance_type="trn1.32xlarge", nodes=16, prebuilt=True)
    ids = [s["id"] for s in boot["steps"]]
    assert ids == ["ec2_launch_os_boot", "cookbook_slurmd", "image_marker"]
    assert boot["seconds"] == 288 and boot["download_mb"] == 0 and not boot["nat_limited"]
    assert "prebuilt image" in describe(boot) and "MB" not in describe(boot)


def test_below_the_nat_gateways_share_a_node_downloads_at_its_own_rate():
    two = estimate(TABLE, instance_type="trn1.32xlarge", nodes=2, prebuilt=False)
    assert not two["nat_limited"] and two["mb_per_s"] == 44
    assert two["seconds"] == round(by_hand(2)) < 752


def test_the_driver_builds_slower_on_the_small_instance():
    small = estimate(TABLE, instance_type="trn1.2xlarge", nodes=16, prebuilt=False)
    big = estimate(TABLE, instance_type="trn1.32xlarge", nodes=16, prebuilt=False)
    assert small["seconds"] - big["seconds"] == 60
    assert {s["id"]: s["seconds"] for s in small["steps"]}["dkms_build"] == 120


@pytest.mark.parametrize("nodes, warns", [(16, False), (64, False), (104, False), (105, True), (256, True)])
def test_the_warning_line_is_70_percent_of_the_timeout(nodes, warns):
    boot = estimate(TABLE, instance_type="trn1.32xlarge", nodes=nodes, prebuilt=False)
    warning = boot_warning(boot, TABLE["warn_at_share"]["value"])
    assert (warning is not None) == warns == (boot["seconds"] >= 0.7 * 2100)
    if warns:
        assert warning.startswith("num_nodes: node boot estimate:") and "trigger trn1_build_image" in warning


def test_a_prebuilt_image_warns_without_pointing_at_itself():
    boot = estimate(TABLE, instance_type="trn1.32xlarge", nodes=16, prebuilt=True)
    warning = boot_warning(boot, 0.1)
    assert warning and "trn1_build_image" not in warning


@pytest.mark.parametrize("num_nodes, min_nodes, expected", [(16, 0, 16), (16, 16, 16), (16, 4, 12), (16, 12, 12),
                                                             (1, 0, 1), (4, 8, 4)])
def test_nodes_that_boot_at_once(num_nodes, min_nodes, expected):
    assert nodes_at_once(num_nodes, min_nodes) == expected


def test_only_the_production_profile_estimates():
    assert load_profile("production")["estimate_boot_time"] is True
    assert load_profile("local")["estimate_boot_time"] is False

