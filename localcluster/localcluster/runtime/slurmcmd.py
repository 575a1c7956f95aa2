"""Run Slurm client commands against one cluster (from the host or a node; SLURM_CONF picks the cluster)."""
from __future__ import annotations

import os
import subprocess
import time

from .node_root import slurm_bin
from .paths import ClusterPaths


def slurm_env(paths: ClusterPaths) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(paths.slurm_conf)
    return env


def slurm(paths: ClusterPaths, *args: str, timeout: float = 20.0, check: bool = True) -> str:
    # /opt/slurm/bin's copy: Debian's /usr/bin commands are hidden inside the nodes (ResumeProgram runs there).
    argv = [str(slurm_bin(paths) / args[0]), *args[1:]]
    done = subprocess.run(argv, env=slurm_env(paths), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, args, done.stdout, done.stderr)
    return done.stdout


def expand_hostlist(paths: ClusterPaths, hostlist: str) -> list[str]:
    return slurm(paths, "scontrol", "show", "hostnames", hostlist).split()


def node_states(paths: ClusterPaths) -> dict[str, str]:
    """node name -> sinfo compact state with flags (idle, idle~, alloc#, down*, ...)."""
    out = slurm(paths, "sinfo", "-h", "-N", "-o", "%N %t", check=False)
    states: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def wait_nodes_state(paths: ClusterPaths, names: list[str], wanted: set[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = node_states(paths)
        if all(states.get(n) in wanted for n in names):
            return True
        time.sleep(0.2)
    return False


def set_node_state(paths: ClusterPaths, names: list[str], state: str, reason: str | None = None) -> None:
    args = ["scontrol", "update", f"nodename={','.join(names)}", f"state={state}"]
    if reason:
        args.append(f"reason={reason}")
    slurm(paths, *args)
