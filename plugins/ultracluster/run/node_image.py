"""The Trn1 node image: what trn1_build_image builds, tags and records, and which image a run's
compute nodes may boot (docs/operations.md, "The node image").

The image is ``pcluster build-image`` of include/cluster/image-config.yaml with the rendered node
script (``run.neuron_versions``) as its component, so it holds exactly the pinned Neuron stack; its
AMI carries the release, the pins' digest and the repository's commit as tags, and its id goes into
an SSM parameter the profile names (``node_image_parameter``). preflight reads the parameter (or the
run's ``custom_ami``) and refuses an image whose tags differ from include/neuron-versions.env.
Stdlib only.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from ultracluster.run.neuron_versions import pins_digest

DAG_ID = "trn1_build_image"
TAG_RELEASE = "ultracluster:neuron-release"
TAG_PINS = "ultracluster:neuron-pins"
TAG_COMMIT = "ultracluster:commit"
# The SSM parameter the image was built for: which images supersede each other.
TAG_PARAMETER = "ultracluster:node-image"
COMMIT_ENV_VAR = "ULTRACLUSTER_COMMIT"
# Under /ultracluster/: the Airflow role's policy grants its SSM reads and writes there only.
PARAMETER_PATTERN = re.compile(r"^/ultracluster/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
ARCHITECTURE = "x86_64"  # Trn1's


class NodeImageError(ValueError):
    """A node image that cannot be built, recorded or used as asked."""


def rebuild_hint(parameter: str | None) -> str:
    where = f" and records it in {parameter}" if parameter else ""
    return f"build one: trigger the {DAG_ID} DAG (it builds the pinned stack into an image{where})"


def check_parameter(name: str) -> str:
    if not PARAMETER_PATTERN.match(name or ""):
        raise NodeImageError(f"node_image_parameter {name!r} must be an SSM parameter name under /ultracluster/ "
                             "(the Airflow role's policy covers that path)")
    return name


def repository_commit(environ: dict[str, str] | None = None, repo: Path | None = None) -> str:
    """The commit the image is built from: ``$ULTRACLUSTER_COMMIT`` (a deployment without .git sets
    it at build time), else ``git rev-parse HEAD`` of the repository; neither is an error."""
    environ = os.environ if environ is None else environ
    commit = (environ.get(COMMIT_ENV_VAR) or "").strip().lower()
    if not commit:
        repo = repo or Path(__file__).resolve().parents[3]
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=False)
        commit = done.stdout.strip() if done.returncode == 0 else ""
        if not commit:
            raise NodeImageError(f"no repository commit to tag the image with: set {COMMIT_ENV_VAR} in the "
                                 f"deployment, or deploy a git checkout ({done.stderr.strip()[-200:]})")
    if not _COMMIT.match(commit):
        raise NodeImageError(f"{COMMIT_ENV_VAR} {commit!r} is not a git commit id")
    return commit


def image_id_for(versions: dict[str, str], commit: str) -> str:
    """One image per (release, pins, commit): a retry or a second trigger finds the same image."""
    release = versions["NEURON_RELEASE"].replace(".", "-")
    return f"uc-neuron-{release}-{pins_digest(versions)[:8]}-{commit[:12]}"


def ami_tags(versions: dict[str, str], commit: str, parameter: str) -> dict[str, str]:
    return {TAG_RELEASE: versions["NEURON_RELEASE"], TAG_PINS: pins_digest(versions), TAG_COMMIT: commit,
            TAG_PARAMETER: parameter}


def check_roles(permissions_boundary: str | None, cleanup_role: str | None) -> None:
    """With a boundary, ParallelCluster cannot create its cleanup role (it makes it without one)."""
    if permissions_boundary and not cleanup_role:
        raise NodeImageError("with a permissions boundary, ParallelCluster cannot create its build-image cleanup "
                             "role: set image_cleanup_role_arn (include/cluster/iam/roles.cfn.json makes it)")


def image_config(base: dict[str, Any], *, image_id: str, region: str, parent_image: str, script_uri: str,
                 tags: dict[str, str], permissions_boundary: str | None = None,
                 cleanup_role: str | None = None) -> dict[str, Any]:
    """include/cluster/image-config.yaml (parsed) with what each build adds: the region, the parent
    image, the rendered node script as the only component, the AMI's name and tags, and the roles'
    boundary (``check_roles``)."""
    build = base.get("Build") or {}
    if "ParentImage" in build or "Components" in build:
        raise NodeImageError("image-config.yaml must leave Build.ParentImage and Build.Components to the build")
    check_roles(permissions_boundary, cleanup_role)
    config = copy.deepcopy(base)
    config["Region"] = region
    build = config.setdefault("Build", {})
    build["ParentImage"] = parent_image
    build["Components"] = [{"Type": "script", "Value": script_uri}]
    iam = {k: v for k, v in (("PermissionsBoundary", permissions_boundary), ("CleanupLambdaRole", cleanup_role)) if v}
    if iam:
        build["Iam"] = {**(build.get("Iam") or {}), **iam}
    image = config.setdefault("Image", {})
    image["Name"] = image_id
    image["Tags"] = [{"Key": k, "Value": v} for k, v in tags.items()]
    return config


def image_problems(ami_id: str, tags: dict[str, str] | None, versions: dict[str, str], source: str) -> list[str]:
    """Why a run's compute nodes must not boot ``ami_id`` (``source``: where the id came from), one line
    each; ``tags`` None: no such image."""
    if tags is None:
        return [f"{source}: image {ami_id} does not exist (or is not visible to this account); {rebuild_hint(None)}"]
    wanted = {TAG_RELEASE: versions["NEURON_RELEASE"], TAG_PINS: pins_digest(versions)}
    found = {key: tags.get(key) for key in wanted}
    if found == wanted:
        return []
    held = ", ".join(f"{k}={v or 'none'}" for k, v in found.items())
    pinned = ", ".join(f"{k}={v}" for k, v in wanted.items())
    return [f"{source}: image {ami_id} holds {held}, include/neuron-versions.env pins {pinned}: its nodes would "
            f"not run the pinned Neuron stack; {rebuild_hint(None)}, then use its image"]


def superseded(images: list[dict[str, Any]], keep: str, parameter: str) -> list[str]:
    """Ids of the images built for ``parameter`` other than ``keep``; ``images``: ``{"imageId", "tags"}``."""
    return sorted(i["imageId"] for i in images
                  if i["imageId"] != keep and (i.get("tags") or {}).get(TAG_PARAMETER) == parameter)
