"""The tools a node image's set-up script calls that would change the machine or reach the network,
as the local image build replaces them (image_build.py puts these first on PATH):

    python -m localcluster.image_shims TOOL ARGS...

Every call is appended to ``$UC_IMAGE_CALLS`` as ``{"tool", "argv"}`` (JSON lines): the record of
what the script installed, with its exact versions. Then:
- ``apt-cache madison NAME``: the versions of neuron_apt_repo.json, in apt-cache's layout;
- ``apt-get install``: a ``name=version`` of a package the repository holds must be one of its
  versions (else apt's "Version ... was not found", exit 100); a ``*-dkms`` package builds its module
  (a recorded ``dkms install`` call, as its postinst does); other packages and verbs just succeed;
- ``python3 -m venv DIR``: a venv whose python runs pip here and the host's python3 otherwise, with
  the venv's site-packages on its path;
- ``pip install`` (that venv's ``python -m pip``): exact ``name==version`` specs only; each becomes a
  distribution in the venv (its dist-info, so importlib.metadata reads the version, and an empty
  package to import);
- ``wget`` prints a placeholder key, ``gpg --dearmor -o FILE`` writes one, ``curl`` fails (the local
  build has no network); ``dkms`` and ``apt-mark`` succeed.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

REPO_FILE = Path(__file__).with_name("neuron_apt_repo.json")
HOST_PYTHON = "/usr/bin/python3"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)$")


def record(tool: str, argv: list[str]) -> None:
    with open(os.environ["UC_IMAGE_CALLS"], "a") as out:
        out.write(json.dumps({"tool": tool, "argv": argv}) + "\n")


def _repository() -> dict[str, list[str]]:
    return json.loads(REPO_FILE.read_text())["packages"]


def apt_cache(argv: list[str]) -> int:
    if argv[:1] == ["madison"]:
        for name in argv[1:]:
            for version in _repository().get(name, []):
                print(f"{name} | {version} | https://apt.repos.neuron.amazonaws.com jammy/main amd64 Packages")
    return 0


def apt_get(argv: list[str]) -> int:
    if "install" not in argv:
        return 0
    repository = _repository()
    for word in argv[argv.index("install") + 1:]:
        if word.startswith("-"):
            continue
        name, _, version = word.partition("=")
        if name in repository and version and version not in repository[name]:
            print(f"E: Version '{version}' for '{name}' was not found", file=sys.stderr)
            return 100
        if name.endswith("-dkms") and version:
            dkms = ["install", "-m", name.removesuffix("-dkms"), "-v", version.split("-")[0], "-k", os.uname().release]
            record("dkms", dkms)
    return 0


def python3(argv: list[str]) -> int:
    if argv[:2] == ["-m", "venv"] and len(argv) == 3:
        venv = Path(argv[2])
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        site = venv / "lib" / "site-packages"
        site.mkdir(parents=True, exist_ok=True)
        shim = shlex.quote(sys.executable)
        python = venv / "bin" / "python"
        python.write_text(
            "#!/bin/sh\n# A venv of the local image build (localcluster.image_shims).\n"
            f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then shift 2; '
            f'exec {shim} -m localcluster.image_shims venv-pip {shlex.quote(str(venv))} "$@"; fi\n'
            f"PYTHONPATH={shlex.quote(str(site))} PYTHONNOUSERSITE=1 exec {HOST_PYTHON} \"$@\"\n")
        python.chmod(0o755)
        for alias in ("python3",):
            (venv / "bin" / alias).unlink(missing_ok=True)
            (venv / "bin" / alias).symlink_to("python")
        return 0
    os.execv(HOST_PYTHON, [HOST_PYTHON, *argv])
    return 1  # not reached


def venv_pip(venv: Path, argv: list[str]) -> int:
    if argv[:1] != ["install"]:
        return 0
    site = venv / "lib" / "site-packages"
    words = iter(argv[1:])
    for word in words:
        if word in ("--extra-index-url", "--index-url", "-i"):
            next(words, None)
            continue
        if word.startswith("-"):
            continue
        match = _PIN.match(word)
        if not match:
            print(f"ERROR: the local image build installs exact pins only (name==version), not {word!r}",
                  file=sys.stderr)
            return 1
        name, version = match.groups()
        normal = re.sub(r"[-_.]+", "_", name).lower()
        info = site / f"{normal}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if normal != "pip":
            package = site / normal
            package.mkdir(exist_ok=True)
            (package / "__init__.py").write_text(f"# {name} {version}: an empty stand-in of the local image build\n")
    return 0


def gpg(argv: list[str]) -> int:
    sys.stdin.read()
    if "-o" in argv:
        Path(argv[argv.index("-o") + 1]).write_bytes(b"local image build: placeholder keyring\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tool, rest = args[0], args[1:]
    if tool == "venv-pip":
        record("pip", ["-m", "pip", *rest[1:]])
        return venv_pip(Path(rest[0]), rest[1:])
    if tool != "python3" or rest[:2] == ["-m", "venv"]:
        record(tool, rest)
    if tool == "apt-cache":
        return apt_cache(rest)
    if tool in ("apt-get", "apt"):
        return apt_get(rest)
    if tool == "python3":
        return python3(rest)
    if tool in ("pip", "pip3"):
        return venv_pip(Path(os.environ.get("VIRTUAL_ENV") or "/usr/local"), rest)
    if tool == "wget":
        print("-----BEGIN PGP PUBLIC KEY BLOCK-----\nlocal image build: placeholder\n"
              "-----END PGP PUBLIC KEY BLOCK-----")
        return 0
    if tool == "gpg":
        return gpg(rest)
    if tool == "curl":
        print("curl: the local image build reaches no network", file=sys.stderr)
        return 7
    return 0  # dkms, apt-mark


if __name__ == "__main__":
    sys.exit(main())
