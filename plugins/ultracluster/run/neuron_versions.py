"""The pinned Neuron stack (include/neuron-versions.env) and its rendering into the node set-up script.

Only on_node_configured.sh reaches the nodes, so render_config (and trn1_build_image, for the node
image) uploads a copy of it whose ``# BEGIN VERSIONS`` ... ``# END VERSIONS`` block holds the versions
file's assignments, shell-quoted, and ``NEURON_INSTALL_AT_BOOT``: whether a compute node whose image
lacks the pinned stack may install it at boot (only where the profile opts in). Specs looser than an
exact version (``*``, ``>=``, ``~=``, a bare name, ...) are refused here, so a loose pin fails
render_config before anything is created. ``stamp`` is the script's own ``--stamp``: what an image
built from the script carries, and its tags name. Stdlib only.

``python -m ultracluster.run.neuron_versions render [--install-at-boot]`` prints the rendered script;
``readme`` rewrites the quoted block in include/training/README.md (``--check``: fail if stale).
"""
from __future__ import annotations

import hashlib
import re
import shlex
import sys
from pathlib import Path

from ultracluster.run.errors import problem_list
from ultracluster.run.profiles import include_dir

VERSIONS_FILE = "neuron-versions.env"
SCRIPT = ("cluster", "on_node_configured.sh")
TRAINING_README = ("training", "README.md")
BEGIN_MARK = "# BEGIN VERSIONS"
END_MARK = "# END VERSIONS"
PLACEHOLDER = "@VERSIONS@"
README_BEGIN = "<!-- neuron-versions:start -->"
README_END = "<!-- neuron-versions:end -->"

# The rendered switch, beside the versions: "true" lets a compute node install the stack at boot.
INSTALL_AT_BOOT_KEY = "NEURON_INSTALL_AT_BOOT"
# What the script's pins_digest hashes, in its order.
STAMPED_KEYS = ("NEURON_RELEASE", "NEURON_APT_PACKAGES", "BOOTSTRAP_PIP_PACKAGES", "NEURON_PIP_PACKAGES",
                "EFA_INSTALLER_VERSION")
REQUIRED_KEYS = ("NEURON_RELEASE", "NEURON_APT_PACKAGES", "BOOTSTRAP_PIP_PACKAGES", "NEURON_PIP_PACKAGES",
                 "EFA_INSTALLER_VERSION")
_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
# An exact version: digits first, no wildcard, no range. apt allows an epoch (1:) and ~; pip a local label.
_APT_SPEC = re.compile(r"^[a-z0-9][a-z0-9.+-]*=[0-9][A-Za-z0-9.+~:-]*$")
_PIP_SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*$")
_EXACT_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)+$")


class VersionsError(ValueError):
    """The versions file or the script does not have the expected shape, or a spec is not exact."""


def _include(*parts: str) -> Path:
    return include_dir().joinpath(*parts)


def parse_versions(text: str, source: str = VERSIONS_FILE) -> dict[str, str]:
    """KEY=VALUE lines (comments and blank lines skipped), values literal: what bash would source."""
    versions: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as err:
            raise VersionsError(f"{source}:{number}: {err}") from None
        if len(tokens) != 1 or "=" not in tokens[0]:
            raise VersionsError(f"{source}:{number}: expected one KEY=VALUE, got {line!r}")
        key, value = tokens[0].split("=", 1)
        if not _KEY.match(key):
            raise VersionsError(f"{source}:{number}: bad key {key!r}")
        if any(c in value for c in "$`\\"):
            raise VersionsError(f"{source}:{number}: {key} must be literal (no $, ` or \\)")
        if key in versions:
            raise VersionsError(f"{source}:{number}: {key} given twice")
        versions[key] = value
    missing = [k for k in REQUIRED_KEYS if k not in versions]
    if missing:
        raise VersionsError(f"{source}: missing {', '.join(missing)}")
    return versions


def load_versions(path: str | Path | None = None) -> dict[str, str]:
    path = Path(path) if path else _include(VERSIONS_FILE)
    return parse_versions(path.read_text(), str(path))


def apt_specs(versions: dict[str, str]) -> list[str]:
    return [s for k, v in versions.items() if k.endswith("_APT_PACKAGES") for s in v.split()]


def pip_specs(versions: dict[str, str]) -> list[str]:
    return [s for k, v in versions.items() if k.endswith("_PIP_PACKAGES") for s in v.split()]


def unpinned(versions: dict[str, str]) -> list[str]:
    """Every value that is not an exact pin, as 'KEY: spec' (empty: all pinned)."""
    problems = []
    for key, value in versions.items():
        if key.endswith("_APT_PACKAGES") or key.endswith("_PIP_PACKAGES"):
            pattern = _APT_SPEC if key.endswith("_APT_PACKAGES") else _PIP_SPEC
            specs = value.split()
            if not specs:
                problems.append(f"{key}: empty")
            problems += [f"{key}: {spec}" for spec in specs if not pattern.match(spec)]
        elif key.endswith("_VERSION") or key.endswith("_RELEASE"):
            if not _EXACT_VERSION.match(value):
                problems.append(f"{key}: {value}")
    return problems


def check_pinned(versions: dict[str, str]) -> None:
    problems = unpinned(versions)
    if problems:
        raise VersionsError(problem_list("Unpinned specs in the Neuron versions (exact versions only)", problems))


def pins_digest(versions: dict[str, str]) -> str:
    """The script's ``pins_digest``: 16 hex digits of the sha256 of every pin, one a line."""
    return hashlib.sha256("".join(f"{versions[k]}\n" for k in STAMPED_KEYS).encode()).hexdigest()[:16]


def stamp(versions: dict[str, str]) -> str:
    """What ``on_node_configured.sh --stamp`` prints: the image marker of an image holding these pins."""
    return f"neuron={versions['NEURON_RELEASE']} pins={pins_digest(versions)}"


def versions_block(versions: dict[str, str], install_at_boot: bool = False) -> str:
    """The assignments as rendered into the script: one KEY=VALUE a line, every value shlex-quoted,
    then the install-at-boot switch."""
    lines = [f"{key}={shlex.quote(value)}\n" for key, value in versions.items() if key != INSTALL_AT_BOOT_KEY]
    return "".join(lines) + f"{INSTALL_AT_BOOT_KEY}={'true' if install_at_boot else 'false'}\n"


def render_script(script_text: str, versions: dict[str, str], *, install_at_boot: bool = False) -> str:
    """The script with its versions block replaced by the (checked) assignments; ``install_at_boot``:
    a compute node whose image lacks the pinned stack installs it (the profile's opt-in), else fails."""
    check_pinned(versions)
    if INSTALL_AT_BOOT_KEY in versions:
        raise VersionsError(f"{INSTALL_AT_BOOT_KEY} is the profile's, not a version: remove it from {VERSIONS_FILE}")
    lines = script_text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.startswith(BEGIN_MARK)]
    ends = [i for i, line in enumerate(lines) if line.startswith(END_MARK)]
    if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
        raise VersionsError(f"the script needs exactly one {BEGIN_MARK!r} line before one {END_MARK!r} line")
    begin, end = begins[0], ends[0]
    rendered = "".join(lines[: begin + 1]) + versions_block(versions, install_at_boot) + "".join(lines[end:])
    if PLACEHOLDER in rendered:
        raise VersionsError(f"{PLACEHOLDER} left outside the versions block")
    return rendered


def render_on_node_configured(script_path: str | Path | None = None, versions_path: str | Path | None = None, *,
                              install_at_boot: bool = False) -> str:
    """What render_config uploads: include/cluster/on_node_configured.sh with the pinned versions."""
    script = Path(script_path) if script_path else _include(*SCRIPT)
    return render_script(script.read_text(), load_versions(versions_path), install_at_boot=install_at_boot)


def readme_block(versions: dict[str, str]) -> str:
    """The versions as include/training/README.md quotes them (between the neuron-versions markers)."""
    rows = [f"Neuron {versions['NEURON_RELEASE']} (`include/{VERSIONS_FILE}`, rendered into the uploaded "
            "`on_node_configured.sh`):", ""]
    labels = {"NEURON_APT_PACKAGES": "apt (Neuron repository)", "BOOTSTRAP_PIP_PACKAGES": "venv pip",
              "NEURON_PIP_PACKAGES": "venv packages (PyPI + Neuron pip repository)"}
    for key, label in labels.items():
        rows.append(f"- {label}: " + ", ".join(f"`{spec}`" for spec in versions[key].split()))
    rows.append(f"- EFA installer (only where the image lacks EFA): `{versions['EFA_INSTALLER_VERSION']}`")
    return "\n".join(rows) + "\n"


def replace_readme_block(readme_text: str, versions: dict[str, str]) -> str:
    start, end = readme_text.find(README_BEGIN), readme_text.find(README_END)
    if start < 0 or end < start:
        raise VersionsError(f"no {README_BEGIN} ... {README_END} block in the training README")
    head = readme_text[: start + len(README_BEGIN)]
    return f"{head}\n{readme_block(versions)}{readme_text[end:]}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    if command == "render":
        sys.stdout.write(render_on_node_configured(install_at_boot="--install-at-boot" in args[1:]))
        return 0
    if command == "readme":
        readme = _include(*TRAINING_README)
        current = readme.read_text()
        wanted = replace_readme_block(current, load_versions())
        if current == wanted:
            return 0
        if "--check" in args[1:]:
            print(f"{readme} does not quote include/{VERSIONS_FILE}: run python -m ultracluster.run.neuron_versions readme",
                  file=sys.stderr)
            return 1
        readme.write_text(wanted)
        return 0
    print("usage: python -m ultracluster.run.neuron_versions render [--install-at-boot] | readme [--check]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
