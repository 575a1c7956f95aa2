"""Start and stop cluster daemons, each in its own mount+UTS namespace that looks like a node."""
from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, asdict
from datetime import datetime, timezone
from pathlib import Path

from .errors import RuntimeProvisionError
from .node_root import overlay_args
from .paths import NODE_SPOOL_DIR, ClusterPaths
from .procs import (kill_pids, ns_inode, pid_alive, pids_in_namespaces, read_pid, shared_uts_inodes,
                    wait_for_pid_file)

START_TIMEOUT_S = 30.0

def ns_exec_script() -> str:
    # Next to the package source (an editable install resolves resources.files() unreliably).
    return str(Path(__file__).resolve().parent.parent / "scripts" / "ns-exec.sh")

def new_instance_id() -> str:
    return "i-" + secrets.token_hex(9)[:17]

def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")

def shared_binds(paths: ClusterPaths, mount_dirs: list[str]) -> list[str]:
    """Per-cluster dirs seen at /home and at every SharedStorage MountDir on every node."""
    binds = [f"{paths.shared_home}=/home"]
    binds += [f"{paths.shared_mount(d)}={d}" for d in mount_dirs]
    return binds

@dataclass
class Launched:
    pid: int
    uts_ns: int
    mnt_ns: int

def launch_in_namespace(paths: ClusterPaths, hostname: str, pid_file: Path, log_file: Path,
                        argv: list[str], mount_dirs: list[str], role: str, fresh_boot: bool = False,
                        extra_env: dict[str, str] | None = None, extra_binds: Sequence[str] = ()) -> Launched:
    """Start argv as `hostname`, a `role` ("head" or "compute") node; returns once the daemon's own PID
    is known (it is written from inside)."""
    cmd = ["unshare", "--mount", "--uts", "--propagation", "private"]
    if fresh_boot:
        # A resumed slurmd must report a boot time after its power-up request, or slurmctld ignores it.
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        cmd += ["--fork", "--time", f"--boottime=-{int(uptime)}"]
    cmd += ["/bin/sh", ns_exec_script(), hostname, str(paths.hosts_file), str(paths.slurm_conf.parent),
            str(pid_file), *shared_binds(paths, mount_dirs), *overlay_args(paths, role), *extra_binds, "--", *argv]
    pid_file.unlink(missing_ok=True)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "SLURM_CONF": str(paths.slurm_conf), "LANG": "C.UTF-8"}
    env.update(extra_env or {})
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env, cwd="/")
    pid = wait_for_pid_file(pid_file, START_TIMEOUT_S)
    if pid is None:
        proc.kill()
        raise RuntimeProvisionError(f"{argv[0]} for {hostname} did not start; see {log_file}")
    uts, mnt = ns_inode(pid, "uts"), ns_inode(pid, "mnt")
    if uts is None or mnt is None:
        raise RuntimeProvisionError(f"{argv[0]} for {hostname} exited at once; see {log_file}")
    if uts in shared_uts_inodes():
        proc.kill()
        raise RuntimeProvisionError(f"{argv[0]} for {hostname} did not get its own UTS namespace")
    return Launched(pid=pid, uts_ns=uts, mnt_ns=mnt)

# --- compute node state: one JSON file per node under run/nodes/ --------------------------------

@dataclass
class NodeState:
    name: str
    state: str                  # "running" | "stopped" | "booting"
    pid: int | None = None
    uts_ns: int | None = None
    instance_id: str | None = None
    launch_time: str | None = None
    requested_at: float | None = None   # epoch of the power-up request (ResumeProgram)

    def to_dict(self) -> dict:
        return asdict(self)

def node_state_file(paths: ClusterPaths, name: str) -> Path:
    return paths.nodes_state / f"{name}.json"

def read_node_state(paths: ClusterPaths, name: str) -> NodeState:
    try:
        return NodeState(**json.loads(node_state_file(paths, name).read_text()))
    except (OSError, ValueError, TypeError):
        return NodeState(name=name, state="stopped")

def write_node_state(paths: ClusterPaths, state: NodeState) -> None:
    paths.nodes_state.mkdir(parents=True, exist_ok=True)
    target = node_state_file(paths, state.name)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.to_dict()))
    tmp.replace(target)

def all_node_states(paths: ClusterPaths) -> list[NodeState]:
    if not paths.nodes_state.is_dir():
        return []
    return [read_node_state(paths, p.stem) for p in sorted(paths.nodes_state.glob("*.json"))]

def slurmd_pid_file(paths: ClusterPaths, name: str) -> Path:
    return paths.run / f"slurmd-{name}.launch.pid"

def start_slurmd(paths: ClusterPaths, name: str, mount_dirs: list[str], fresh_boot: bool,
                 instance: tuple[str, str] | None = None) -> NodeState:
    """Boot one compute node: a slurmd in the foreground inside the node's namespaces.
    ``instance``: the node's EC2 (instance id, launch time)."""
    paths.node_spool(name).mkdir(parents=True, exist_ok=True)
    launched = launch_in_namespace(
        paths, name, slurmd_pid_file(paths, name), paths.logs / f"slurmd-{name}.out",
        ["/usr/sbin/slurmd", "-D", "-f", str(paths.slurm_daemon_conf), "-N", name],
        mount_dirs, role="compute", fresh_boot=fresh_boot, extra_binds=[f"{paths.node_spool(name)}={NODE_SPOOL_DIR}"])
    state = NodeState(name=name, state="running", pid=launched.pid, uts_ns=launched.uts_ns,
                      instance_id=instance[0] if instance else None,
                      launch_time=instance[1] if instance else None)
    write_node_state(paths, state)
    return state

def kill_node_processes(paths: ClusterPaths, uts_ns: int | None, grace: float) -> list[int]:
    """The node's slurmd and everything in its namespace (job steps, user processes)."""
    victims = pids_in_namespaces({uts_ns}, paths.hosts_file) if uts_ns else []
    return kill_pids(sorted(victims), grace=grace)

def stop_slurmd(paths: ClusterPaths, name: str, grace: float = 3.0) -> list[int]:
    state = read_node_state(paths, name)
    stopped = kill_node_processes(paths, state.uts_ns, grace)
    write_node_state(paths, NodeState(name=name, state="stopped"))
    return stopped

def node_is_up(paths: ClusterPaths, name: str) -> bool:
    state = read_node_state(paths, name)
    return state.state == "running" and state.pid is not None and pid_alive(state.pid)

def wait_slurmd_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False

def head_launch(paths: ClusterPaths, head_name: str, daemon: str, argv: list[str],
                mount_dirs: list[str], extra_env: dict[str, str] | None = None) -> Launched:
    """A head-node daemon (slurmctld, slurmdbd, sshd), each in its own head-node-like namespace."""
    launched = launch_in_namespace(paths, head_name, paths.run / f"{daemon}.launch.pid",
                                   paths.logs / f"{daemon}.out", argv, mount_dirs, role="head", extra_env=extra_env)
    record_daemon(paths, daemon, launched)
    return launched

def record_daemon(paths: ClusterPaths, daemon: str, launched: Launched) -> None:
    daemons_file = paths.run / "daemons.json"
    daemons = read_daemons(paths)
    previous = daemons.get(daemon, {})
    # Namespaces of earlier incarnations (sshd after an outage) stay listed so teardown sweeps them too.
    retired = previous.get("retired_uts_ns", [])
    if previous.get("uts_ns") and previous["uts_ns"] != launched.uts_ns:
        retired = [*retired, previous["uts_ns"]]
    daemons[daemon] = {"pid": launched.pid, "uts_ns": launched.uts_ns, "retired_uts_ns": retired}
    daemons_file.write_text(json.dumps(daemons))

def read_daemons(paths: ClusterPaths) -> dict[str, dict]:
    try:
        return json.loads((paths.run / "daemons.json").read_text())
    except (OSError, ValueError):
        return {}

def daemon_pid(paths: ClusterPaths, daemon: str) -> int | None:
    info = read_daemons(paths).get(daemon)
    if info and pid_alive(info["pid"]):
        return int(info["pid"])
    return read_pid(paths.run / f"{daemon}.launch.pid")

