"""Per-cluster state under LOCAL_ULTRACLUSTER_HOME: cluster.json guarded by a lock, written atomically.

<home>/clusters/<name>/cluster.json   what pcluster reports (status, ARN, times, tags, fleet)
<home>/clusters/<name>/spec.json      the ClusterSpec the runtime reads
<home>/locks/<name>.lock              flock for cluster.json (outlives the cluster dir on purpose)
<home>/logs/clusters.jsonl            the ledger: one line per cluster created or deleted, kept after
                                      the cluster (what was alive when, with its tags)
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_HOME = "/var/lib/local-ultracluster"


class ClusterNotFound(Exception):
    pass


class ClusterExists(Exception):
    pass


def uc_home() -> Path:
    return Path(os.environ.get("LOCAL_ULTRACLUSTER_HOME", DEFAULT_HOME))


def ledger_path(home: Path | None = None) -> Path:
    return (home or uc_home()) / "logs" / "clusters.jsonl"


def record(event: str, name: str, tags: dict[str, str] | None = None, home: Path | None = None) -> None:
    """Append ``{"time", "event": "created"|"deleted", "cluster", "tags"}`` to the ledger."""
    from datetime import datetime, timezone

    path = ledger_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": datetime.now(timezone.utc).isoformat(), "event": event, "cluster": name,
                       "tags": tags or {}})
    with open(path, "a") as out:  # one short write per line: appends do not interleave
        out.write(line + "\n")


def record_call(argv: list[str], home: Path | None = None) -> None:
    """Append ``{"time", "command", "cluster"}`` to logs/pcluster-calls.jsonl: the CLI calls a client
    made, kept after the cluster (bench/pipeline.py counts them per wait). Best effort."""
    from datetime import datetime, timezone

    cluster = next((argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("-n", "--cluster-name")), None)
    line = json.dumps({"time": datetime.now(timezone.utc).isoformat(), "command": argv[0] if argv else "",
                       "cluster": cluster})
    try:
        path = (home or uc_home()) / "logs" / "pcluster-calls.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as out:
            out.write(line + "\n")
    except OSError:
        pass


def clusters_root(home: Path | None = None) -> Path:
    return (home or uc_home()) / "clusters"


def cluster_dir(name: str, home: Path | None = None) -> Path:
    return clusters_root(home) / name


def _lock_path(name: str, home: Path | None) -> Path:
    locks = (home or uc_home()) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return locks / f"{name}.lock"


@contextmanager
def cluster_lock(name: str, home: Path | None = None) -> Iterator[None]:
    with open(_lock_path(name, home), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def state_file(name: str, home: Path | None = None) -> Path:
    return cluster_dir(name, home) / "cluster.json"


def read_state(name: str, home: Path | None = None) -> dict[str, Any]:
    try:
        return json.loads(state_file(name, home).read_text())
    except (FileNotFoundError, NotADirectoryError):
        raise ClusterNotFound(name) from None


def reserve_cluster(name: str, initial: dict[str, Any], home: Path | None = None) -> Path:
    """Create the cluster dir and cluster.json, or raise ClusterExists; atomic under the lock."""
    with cluster_lock(name, home):
        directory = cluster_dir(name, home)
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir()
        except FileExistsError:
            raise ClusterExists(name) from None
        write_json_atomic(directory / "cluster.json", initial)
        return directory


@contextmanager
def update_state(name: str, home: Path | None = None) -> Iterator[dict[str, Any]]:
    """Read-modify-write cluster.json under the lock; the caller mutates the yielded dict."""
    with cluster_lock(name, home):
        state = read_state(name, home)
        yield state
        if state_file(name, home).parent.is_dir():
            write_json_atomic(state_file(name, home), state)


def list_cluster_names(home: Path | None = None) -> list[str]:
    root = clusters_root(home)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "cluster.json").is_file())
