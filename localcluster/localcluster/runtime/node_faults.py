"""Node faults that go with an instance: `neuron-unhealthy` and `efa-unhealthy` make the node's neuron-ls
or fi_info stand-in report one device fewer, as a failed device drops out of the real tools' lists.

A target `NODE` binds the fault to the node's instance: the one it runs on when the fault is set, or the
next one launched for it when it has none (every node at provision, a powered-down dynamic node). A
replacement (a new instance under the same Slurm name, instances.py) does not have it, as a faulty
device leaves with the replaced instance. `NODE:always` holds on every instance of the node.

`run/faults/<knob>` has one line per target: `NODE INSTANCE_ID`, `NODE next` (bound when the node's next
instance is launched) or `NODE always`. The stand-ins read it inside the nodes together with the node's
current instance id from `run/nodes/<node>.json` (shell_devices()).
"""
from __future__ import annotations

import fcntl
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..spec import ALWAYS, parse_fault_target
from .paths import ClusterPaths

KNOBS = ("neuron-unhealthy", "efa-unhealthy")
NEXT = "next"


def fault_file(paths: ClusterPaths, knob: str) -> Path:
    if knob not in KNOBS:
        raise ValueError(f"unknown node fault {knob!r}; known: {', '.join(KNOBS)}")
    return paths.run / "faults" / knob


@contextmanager
def _locked(paths: ClusterPaths) -> Iterator[None]:
    lock = paths.run / "faults" / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _write(target: Path, lines: list[str]) -> None:
    tmp = target.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.chmod(0o644)   # read inside the nodes by the cluster user's jobs
    tmp.replace(target)


def _current_instance(paths: ClusterPaths, node: str) -> str | None:
    from .nodes import read_node_state   # nodes -> node_root -> the stand-ins -> here
    state = read_node_state(paths, node)
    return state.instance_id if state.state in ("running", "booting") else None


def set_targets(paths: ClusterPaths, knob: str, targets: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """Replace the knob's targets (NODE or NODE:always); returns the lines written."""
    lines = []
    for target in targets:
        node, always = parse_fault_target(target)
        if node not in nodes:
            raise ValueError(f"{knob}: {node!r} is not a compute node of this cluster; its nodes: {', '.join(nodes)}")
        lines.append(f"{node} {ALWAYS if always else _current_instance(paths, node) or NEXT}")
    with _locked(paths):
        _write(fault_file(paths, knob), lines)
    return lines


def bind_next(paths: ClusterPaths, node: str, instance_id: str) -> None:
    """A new instance for the node: faults waiting for its next instance now hold on this one."""
    with _locked(paths):
        for knob in KNOBS:
            target = fault_file(paths, knob)
            lines = target.read_text().splitlines() if target.exists() else []
            bound = [f"{node} {instance_id}" if line == f"{node} {NEXT}" else line for line in lines]
            if bound != lines:
                _write(target, bound)


def shell_devices(paths: ClusterPaths, knob: str, devices: dict[str, tuple[str, int]]) -> str:
    """Bash lines setting $node, $type and $devices for a stand-in: the node's instance type and device
    count (``devices``: node -> both), one fewer where the knob's fault holds on the node's instance."""
    cases = "\n".join(f"    {shlex.quote(name)}) type={shlex.quote(itype)} devices={count} ;;"
                      for name, (itype, count) in devices.items())
    state_file = shlex.quote(str(paths.nodes_state)) + '/"$node".json'   # nodes.node_state_file()
    targets = shlex.quote(str(fault_file(paths, knob)))
    return f"""node=$(hostname)
case "$node" in
{cases}
    *) type=unknown devices=0 ;;
esac
instance=$(sed -n 's/.*"instance_id": "\\([^"]*\\)".*/\\1/p' {state_file} 2>/dev/null)
if grep -qxF -e "$node {ALWAYS}" -e "$node ${{instance:-none}}" {targets} 2>/dev/null \\
        && [ "$devices" -gt 0 ]; then
    devices=$((devices - 1))   # local-ultracluster fault {knob}
fi"""
