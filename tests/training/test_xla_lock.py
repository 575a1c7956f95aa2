"""The production-twin training venv's pins agree with include/neuron-versions.env.

requirements-xla.txt names the training packages of NEURON_PIP_PACKAGES that PyPI serves, at the
same exact versions; requirements-xla.lock (uv pip compile) pins them and every indirect dependency.
"""
from __future__ import annotations

import re
import shlex

from tests.training.support import REPO, TRAINING_DIR
from ultracluster.run.neuron_versions import load_versions

REQUIREMENTS = TRAINING_DIR / "requirements-xla.txt"
LOCK = TRAINING_DIR / "requirements-xla.lock"
# Not on PyPI (Neuron's own pip repository only): the documented gaps of the twin.
NEURON_ONLY = {"neuronx-cc", "torch-neuronx"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)$")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str, source: str) -> dict[str, str]:
    """name -> version of every requirement line; anything but an exact pin fails."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"{source}: {line!r} is not an exact pin (name==version)"
        found[normalise(match.group(1))] = match.group(2)
    return found


def neuron_pip_pins() -> dict[str, str]:
    specs = load_versions()["NEURON_PIP_PACKAGES"].split()
    return pins("\n".join(specs), "NEURON_PIP_PACKAGES")


def test_requirements_are_the_pypi_served_training_pins_of_neuron_versions():
    wanted = {name: version for name, version in neuron_pip_pins().items() if name not in NEURON_ONLY}
    assert set(neuron_pip_pins()) - set(wanted) == NEURON_ONLY
    assert pins(REQUIREMENTS.read_text(), REQUIREMENTS.name) == wanted


def test_lock_pins_every_package_exactly_and_agrees_with_neuron_versions():
    locked = pins(LOCK.read_text(), LOCK.name)
    for name, version in pins(REQUIREMENTS.read_text(), REQUIREMENTS.name).items():
        assert locked.get(name) == version, f"{LOCK.name} pins {name}=={locked.get(name)}, not {version}"
    # The production torch: PyPI's build, no local label (+cpu would be another wheel than the nodes').
    assert "+" not in locked["torch"]
    assert not NEURON_ONLY & set(locked)


def test_make_lock_regenerates_the_lock_with_the_command_it_was_made_with():
    header = re.search(r"^#\s+(uv pip compile .*)$", LOCK.read_text(), re.M).group(1)
    makefile = (REPO / "Makefile").read_text()
    lines = [line.strip() for line in makefile.splitlines() if "requirements-xla.lock" in line]
    assert len(lines) == 1
    # uv writes its command into the header without -q.
    make_args = [arg for arg in shlex.split(lines[0].lstrip("@"))[1:] if arg != "-q"]
    assert make_args == shlex.split(header)[1:], (header, lines[0])
