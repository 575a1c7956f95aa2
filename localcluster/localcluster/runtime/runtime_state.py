"""runtime.json: what provision() built, read by every other entry point."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..spec import ClusterSpec
from .layout import ComputeNode
from .paths import ClusterPaths


def load_runtime(paths: ClusterPaths) -> dict:
    return json.loads(paths.runtime_json.read_text())


def save_runtime(paths: ClusterPaths, runtime: dict) -> None:
    tmp = paths.runtime_json.with_suffix(".tmp")
    tmp.write_text(json.dumps(runtime, indent=2))
    os.replace(tmp, paths.runtime_json)


def load_spec(paths: ClusterPaths) -> ClusterSpec:
    return ClusterSpec.from_dict(json.loads(paths.spec_json.read_text()))


def runtime_nodes(runtime: dict) -> list[ComputeNode]:
    return [ComputeNode(**n) for n in runtime["nodes"]]


def find_node(runtime: dict, name: str) -> ComputeNode:
    for node in runtime_nodes(runtime):
        if node.name == name:
            return node
    raise KeyError(name)


def runtime_aws(runtime: dict):
    """The moto the cluster was created against (Slurm's power programs run without its env)."""
    from ..aws import Aws
    return Aws(runtime["aws"]["region"], runtime["aws"]["endpoint"])


def cluster_paths(cluster_dir: Path) -> ClusterPaths:
    return ClusterPaths(Path(cluster_dir).resolve())


@contextmanager
def fleet_lock(paths: ClusterPaths) -> Iterator[None]:
    """Held while the compute fleet's status changes and while clustermgtd acts on nodes, so that it never
    takes the nodes a fleet stop sets down for unhealthy ones."""
    with open(paths.run / "fleet.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
