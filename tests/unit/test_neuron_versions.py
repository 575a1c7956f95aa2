"""The pinned Neuron stack: one versions file, rendered into the node set-up script, quoted by the README.

The script runs here only on paths that install nothing (head node, already configured, an image that
holds the pinned stack), in a temp state dir, with every installer on PATH replaced by a stub that
records the call and fails: no network, no change to this machine.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ultracluster.run.neuron_versions import (
    PLACEHOLDER,
    VersionsError,
    apt_specs,
    load_versions,
    parse_versions,
    pins_digest,
    pip_specs,
    readme_block,
    render_on_node_configured,
    render_script,
    replace_readme_block,
    stamp,
    unpinned,
)
from ultracluster.run.profiles import include_dir

BASH = shutil.which("bash")
INSTALLERS = ("apt-get", "apt-cache", "apt-mark", "wget", "curl", "gpg", "install", "tar", "python3", "pip", "lspci")
# Node set-up installs these by bare name on purpose: they come from the Ubuntu release's own archive
# (kernel headers of the running kernel, the distribution's python3-venv), not from the Neuron stack.
OS_PACKAGES = {"linux-headers-RUNNING-KERNEL", "git", "python3-venv", "g++"}
# The script's install arguments that expand the pinned lists (NEURON_APT_PACKAGES resolved to the
# repository's builds, BOOTSTRAP_PIP_PACKAGES, NEURON_PIP_PACKAGES) and the Neuron pip index.
PINNED_EXPANSIONS = {'"${specs[@]}"', '"${bootstrap[@]}"', '"${packages[@]}"', '"${NEURON_PIP_REPO}"'}


@pytest.fixture(scope="module")
def versions() -> dict[str, str]:
    return load_versions()


@pytest.fixture(scope="module")
def rendered() -> str:
    return render_on_node_configured()


# --- (1) nothing unpinned ------------------------------------------------------------------------

def test_versions_file_pins_the_chosen_release_exactly(versions):
    assert versions["NEURON_RELEASE"] == "2.28.0"
    assert unpinned(versions) == []
    assert {s.split("=")[0] for s in apt_specs(versions)} == {
        "aws-neuronx-dkms", "aws-neuronx-runtime-lib", "aws-neuronx-collectives", "aws-neuronx-tools"}
    pinned = dict(s.split("==") for s in pip_specs(versions))
    assert {"neuronx-cc", "torch-neuronx", "torch", "torch-xla", "transformers", "pip"} <= set(pinned)
    assert pinned["torch-neuronx"].startswith("2.9.0.") and pinned["torch"] == "2.9.0"
    assert re.fullmatch(r"\d+\.\d+\.\d+", versions["EFA_INSTALLER_VERSION"])


@pytest.mark.parametrize("bad", [
    'NEURON_PIP_PACKAGES="torch-neuronx==2.*"', 'NEURON_PIP_PACKAGES="torch>=2.9"',
    'NEURON_PIP_PACKAGES="torch~=2.9.0"', 'NEURON_PIP_PACKAGES="h5py"', 'NEURON_PIP_PACKAGES="torch==2.9.0 h5py"',
    'NEURON_PIP_PACKAGES="torch!=2.8"', 'NEURON_PIP_PACKAGES=""',
    'NEURON_APT_PACKAGES="aws-neuronx-dkms=2.*"', 'NEURON_APT_PACKAGES="aws-neuronx-dkms"',
    'NEURON_APT_PACKAGES="aws-neuronx-dkms>=2.26"', "EFA_INSTALLER_VERSION=latest", "NEURON_RELEASE=2.*",
])
def test_an_unpinned_spec_is_refused(bad, rendered):
    text = (include_dir() / "neuron-versions.env").read_text()
    key = bad.split("=", 1)[0]
    loose = re.sub(rf"^{key}=.*$", bad, text, count=1, flags=re.M)
    versions = parse_versions(loose)
    assert unpinned(versions), bad
    with pytest.raises(VersionsError, match="Unpinned"):
        render_script((include_dir() / "cluster" / "on_node_configured.sh").read_text(), versions)


def _install_lines(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines()
            if re.search(r"\b(apt-get|pip)\b.*\binstall\b", line) and not line.strip().startswith("#")]


def test_rendered_script_installs_only_pinned_specs(rendered):
    """Every package the rendered script installs is a pinned variable, or one of the named OS packages."""
    lines = rendered.splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.startswith("# BEGIN VERSIONS"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# END VERSIONS"))
    assigned = parse_versions("".join(lines[begin + 1:end]), "rendered block")
    assert unpinned(assigned) == []
    install_lines = _install_lines(rendered)
    assert install_lines, "no install command found"
    for line in install_lines:
        words = line.replace('"linux-headers-$(uname -r)"', "linux-headers-RUNNING-KERNEL").split()
        for word in words[words.index("install") + 1:]:
            if word.startswith("-") or word in PINNED_EXPANSIONS or word in OS_PACKAGES:
                continue
            pytest.fail(f"unpinned install argument {word!r} in: {line}")
    assert not re.search(r"(==|=)\S*\*|>=|~=", "\n".join(install_lines))


# --- (2) rendering ------------------------------------------------------------------------------

def test_rendered_script_has_the_pins_and_no_placeholder(rendered, versions):
    assert PLACEHOLDER not in rendered
    for key, value in versions.items():
        assert f"{key}={shlex.quote(value)}\n" in rendered
    assert "latest" not in rendered
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in rendered
    raw = (include_dir() / "cluster" / "on_node_configured.sh").read_text()
    assert PLACEHOLDER in raw and "NEURON_RELEASE=" not in raw


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_rendered_script_parses(rendered, tmp_path):
    script = tmp_path / "on_node_configured.sh"
    script.write_text(rendered)
    subprocess.run([BASH, "-n", str(script)], check=True)


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_unrendered_script_refuses_to_run(tmp_path):
    node = _Node(tmp_path, (include_dir() / "cluster" / "on_node_configured.sh").read_text())
    result = node.run("HeadNode")
    assert result.returncode != 0 and "versions not rendered" in result.stderr
    assert node.calls() == [] and not node.marker.exists()


def test_render_needs_one_versions_block(versions):
    with pytest.raises(VersionsError, match="exactly one"):
        render_script("#!/bin/bash\necho no block\n", versions)
    with pytest.raises(VersionsError, match="exactly one"):
        render_script("# END VERSIONS\n# BEGIN VERSIONS\n", versions)


# --- (3) the training README quotes the same file -----------------------------------------------

def test_training_readme_quotes_the_versions_file(versions):
    readme = (include_dir() / "training" / "README.md").read_text()
    assert replace_readme_block(readme, versions) == readme, (
        "include/training/README.md is stale: python -m ultracluster.run.neuron_versions readme")
    for spec in apt_specs(versions) + pip_specs(versions):
        assert f"`{spec}`" in readme
    assert f"Neuron {versions['NEURON_RELEASE']}" in readme_block(versions)


# --- (4) the skip logic, run in a sandbox -------------------------------------------------------

class _Node:
    """The script in a temp dir: own state dir and cfnconfig, every installer a recording, failing stub."""

    def __init__(self, root: Path, script_text: str):
        self.root = root
        self.script = root / "on_node_configured.sh"
        self.script.write_text(script_text)
        self.state = root / "state"
        self.marker = self.state / "on_node_configured.done"
        self.image_marker = self.state / "neuron-image.done"
        self.cfnconfig = root / "cfnconfig"
        self.log = root / "calls.log"
        stubs = root / "bin"
        stubs.mkdir()
        for name in INSTALLERS:
            stub = stubs / name
            stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {shlex.quote(str(self.log))}\nexit 97\n')
            stub.chmod(0o755)
        self.env = {"PATH": f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}", "UC_STATE_DIR": str(self.state),
                    "UC_CFNCONFIG": str(self.cfnconfig), "LC_ALL": "C"}

    def run(self, node_type: str, *args: str) -> subprocess.CompletedProcess:
        self.cfnconfig.write_text(f"cfn_region=us-east-1\ncfn_node_type={node_type}\n")
        return subprocess.run([BASH, str(self.script), *args], env=self.env, capture_output=True, text=True,
                              timeout=60)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def node(tmp_path, rendered):
    if BASH is None:
        pytest.skip("needs bash")
    return _Node(tmp_path, rendered)


def test_head_node_gets_the_marker_with_the_release_and_installs_nothing(node, versions):
    result = node.run("HeadNode")
    assert result.returncode == 0, result.stderr
    marker = node.marker.read_text().strip()
    assert marker.startswith(f"neuron={versions['NEURON_RELEASE']} pins=") and marker.endswith(" node=HeadNode")
    assert node.calls() == []

    again = node.run("HeadNode")
    assert again.returncode == 0 and "already configured for Neuron 2.28.0" in again.stdout
    assert node.calls() == []


def test_compute_node_on_an_image_with_the_pinned_release_installs_nothing(node):
    stamp = node.run("ComputeFleet", "--stamp")
    assert stamp.returncode == 0 and stamp.stdout.startswith("neuron=2.28.0 pins=")
    node.state.mkdir()
    node.image_marker.write_text(stamp.stdout)

    result = node.run("ComputeFleet")
    assert result.returncode == 0, result.stderr
    assert "the image already holds Neuron 2.28.0" in result.stdout
    assert node.marker.read_text().strip() == f"{stamp.stdout.strip()} node=ComputeFleet"
    assert [c for c in node.calls() if not c.startswith("lspci")] == []  # lspci only looks for a device


def test_compute_node_without_the_image_fails_unless_the_profile_installs_at_boot(node, versions):
    """The default rendering (install_neuron_at_boot off): no image marker, or another release's, fails the
    node at once, naming what to build, and installs nothing."""
    assert "NEURON_INSTALL_AT_BOOT=false\n" in node.script.read_text()
    for marker in (None, "neuron=2.27.1 pins=0123456789abcdef\n"):
        if marker:
            node.state.mkdir(exist_ok=True)
            node.image_marker.write_text(marker)
        result = node.run("ComputeFleet")
        assert result.returncode == 1, result.stdout
        assert "does not install Neuron at boot (install_neuron_at_boot)" in result.stdout
        assert "trn1_build_image" in result.stdout
        assert node.calls() == [] and not node.marker.exists()
    assert node.run("HeadNode").returncode == 0  # the head node needs no Neuron stack either way


def test_stamp_is_the_scripts_own(node, versions):
    """What the image's tags name (run.neuron_versions.stamp) is what the script writes into the image."""
    result = node.run("ComputeFleet", "--stamp")
    assert result.returncode == 0 and result.stdout.strip() == stamp(versions)
    assert stamp(versions) == f"neuron=2.28.0 pins={pins_digest(versions)}" and len(pins_digest(versions)) == 16


def test_the_versions_file_cannot_switch_installs_at_boot_on(versions):
    with pytest.raises(VersionsError, match="profile's, not a version"):
        render_script((include_dir() / "cluster" / "on_node_configured.sh").read_text(),
                      {**versions, "NEURON_INSTALL_AT_BOOT": "true"})


def test_compute_node_without_the_release_installs_and_a_failure_leaves_no_marker(tmp_path):
    """With the opt-in, an image of another release (or none) means an install; here the first installer
    stub fails it."""
    if BASH is None:
        pytest.skip("needs bash")
    node = _Node(tmp_path, render_on_node_configured(install_at_boot=True))
    assert "NEURON_INSTALL_AT_BOOT=true\n" in node.script.read_text()
    node.state.mkdir()
    node.image_marker.write_text("neuron=2.27.1 pins=0123456789abcdef\n")
    result = node.run("ComputeFleet")
    assert result.returncode != 0
    assert "the image holds neuron=2.27.1" in result.stdout
    assert node.calls(), "expected the install to start"
    assert not node.marker.exists()


def test_a_changed_pin_reconfigures_a_node(node, rendered, versions):
    assert node.run("HeadNode").returncode == 0
    first = node.marker.read_text()
    bumped = rendered.replace(f"EFA_INSTALLER_VERSION={versions['EFA_INSTALLER_VERSION']}",
                              "EFA_INSTALLER_VERSION=1.99.0")
    node.script.write_text(bumped)
    result = node.run("HeadNode")
    assert result.returncode == 0 and "configuring a HeadNode node" in result.stdout
    assert node.marker.read_text() != first and node.marker.read_text().startswith("neuron=2.28.0 ")


def test_image_build_without_cfnconfig_installs_then_an_image_with_the_stamp_is_left_alone(node):
    """pcluster build-image runs the component with no arguments and no cfnconfig: the image path."""
    node.cfnconfig.unlink(missing_ok=True)
    def env_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([BASH, str(node.script), *args], env=node.env, capture_output=True, text=True,
                              timeout=60)

    result = env_run()
    assert result.returncode != 0 and "installing Neuron 2.28.0 into the image" in result.stdout
    assert node.calls() and not node.image_marker.exists() and not node.marker.exists()

    node.state.mkdir(exist_ok=True)
    node.image_marker.write_text(env_run("--stamp").stdout)
    calls = len(node.calls())
    again = env_run()
    assert again.returncode == 0 and "the image already holds Neuron 2.28.0" in again.stdout
    assert len(node.calls()) == calls and not node.marker.exists()
