"""provision(): turn a ClusterSpec into running daemons (blocking)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from ..aws import endpoint_url
from ..spec import ClusterSpec
from . import accounting, clustermgtd, instances, munge, node_faults, node_root, sshd
from .errors import RuntimeProvisionError
from .layout import ComputeNode, compute_nodes, count_compute_nodes, head_hostname, hosts_file_text
from .nodes import head_launch, start_slurmd, utc_now_iso
from .paths import ClusterPaths, ssh_port
from .procs import wait_listening
from .runtime_state import cluster_paths, runtime_aws, save_runtime
from .slots import Slot, allocate_slot
from .slurmcmd import wait_nodes_state
from .slurmconf import render_slurm_conf, render_slurmdbd_conf, resume_timeout, slurm_cluster_name
from .users import prepare_shared_home

NODE_READY_TIMEOUT_S = 60.0
HELPER_START_TIMEOUT_S = 30.0


def provision(spec: ClusterSpec, cluster_dir: Path) -> dict:
    paths = cluster_paths(cluster_dir)
    started = time.monotonic()
    try:
        runtime = _provision(spec, paths)
    except Exception as exc:
        from .teardown import stop_cluster_processes, release_cluster
        stop_cluster_processes(paths)
        release_cluster(paths, spec.name)
        shutil.rmtree(paths.short_run, ignore_errors=True)
        if isinstance(exc, RuntimeProvisionError):
            raise
        raise RuntimeProvisionError(f"provisioning {spec.name} failed: {exc}") from exc
    runtime["bring_up_seconds"] = round(time.monotonic() - started, 3)
    save_runtime(paths, runtime)
    if spec.faults.kill_node_after is not None or spec.faults.ssh_outage is not None:
        _start_helper(paths, "agent")
    return runtime


def _check_traversable(path: Path) -> None:
    """Slurm jobs and ssh sessions run as the cluster user and must reach files under cluster_dir."""
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise RuntimeProvisionError(f"{part} is not searchable by other users (chmod o+x); "
                                        "the cluster user must reach the cluster's files")


def _make_dirs(paths: ClusterPaths, spec: ClusterSpec) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.root.chmod(0o755)
    _check_traversable(paths.root)
    for directory in (paths.etc, paths.slurm_conf.parent, paths.run, paths.nodes_state, paths.logs,
                      paths.spool, paths.bin, paths.shared_home):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
    for mount_dir in spec.mount_dirs:
        shared = paths.shared_mount(mount_dir)
        shared.mkdir(parents=True, exist_ok=True)
        # Scratch-like shared storage every cluster user can write to.
        shared.chmod(0o1777)


def _write_power_scripts(paths: ClusterPaths, resume_timeout_s: int) -> None:
    for action in ("resume", "suspend", "resume-fail"):
        script = paths.bin / action
        script.write_text(f"#!/bin/sh\nexec {sys.executable} -I -m localcluster.runtime.power {action} "
                          f"{paths.root} \"$@\"\n")
        script.chmod(0o755)
    prolog = paths.bin / "task-prolog"
    prolog.write_text(f"#!/bin/sh\necho export SLURM_CONF={paths.slurm_conf}\n")
    prolog.chmod(0o755)
    ctld_prolog = paths.bin / "ctld-prolog"
    ctld_prolog.write_text(ctld_prolog_script(paths, resume_timeout_s))
    ctld_prolog.chmod(0o755)


def ctld_prolog_script(paths: ClusterPaths, resume_timeout_s: int) -> str:
    """PrologSlurmctld: wait until the job's nodes have left power-up (registered, or down), then exit 0.

    Slurm 22.05 starts a batch job on freshly resumed nodes at its 30 s periodic check, or as soon as
    a PrologSlurmctld ends: ending it when the nodes are ready removes up to 30 s before every job
    that powers nodes up. It never fails a job; a node that does not come up ends the wait.
    """
    return f"""#!/bin/sh
export SLURM_CONF={paths.slurm_conf}
deadline=$(( $(date +%s) + {resume_timeout_s} ))
while [ "$(date +%s)" -lt "$deadline" ]; do
    states=$({node_root.slurm_bin(paths) / "sinfo"} -h -N -n "$SLURM_JOB_NODELIST" -o %t 2>/dev/null) || exit 0
    case "$states" in
        *down*|*drain*|*fail*) exit 0 ;;   # the job's fate is Slurm's, not the prolog's
        *'~'*|*'#'*|*'%'*) sleep 0.2 ;;    # powered down, powering up or down
        *) exit 0 ;;
    esac
done
exit 0
"""


def _runtime_doc(spec: ClusterSpec, paths: ClusterPaths, slot: Slot, head_name: str,
                 nodes: list[ComputeNode]) -> dict:
    return {
        "cluster_name": spec.name,
        "slot": slot.index,
        "head_node": {"hostname": head_name, "ip": slot.head_ip, "ssh_port": ssh_port(),
                      "instance_id": None, "launch_time": utc_now_iso(), "state": "running",
                      "instance_type": spec.head_instance_type},
        # Every node is also an EC2 instance in moto, launched and terminated with it (instances.md).
        "aws": {"region": spec.region, "endpoint": endpoint_url()},
        "ssh_user": node_root.default_user(spec.image_os),
        "compute_node_bootstrap_timeout": spec.compute_node_bootstrap_timeout,
        "slurm": {"cluster_name": slurm_cluster_name(spec.name), "conf": str(paths.slurm_conf),
                  "slurmctld_port": slot.slurmctld_port,
                  "slurmdbd_port": slot.slurmdbd_port if spec.accounting else None,
                  "munge_socket": str(paths.munge_socket),
                  "slurmd_ports": {n.name: n.port for n in nodes}},
        "accounting": spec.accounting,
        "mount_dirs": list(spec.mount_dirs),
        "shared_dirs": {"/home": str(paths.shared_home),
                        **{d: str(paths.shared_mount(d)) for d in spec.mount_dirs}},
        "nodes": [n.to_dict() for n in nodes],
        "faults": {"insufficient_capacity": list(spec.faults.insufficient_capacity),
                   "insufficient_capacity_timeout": spec.faults.insufficient_capacity_timeout,
                   "kill_node_after": spec.faults.kill_node_after,
                   "ssh_outage": list(spec.faults.ssh_outage) if spec.faults.ssh_outage else None,
                   "boot_delay": spec.faults.boot_delay,
                   "neuron_unhealthy": list(spec.faults.neuron_unhealthy),
                   "efa_unhealthy": list(spec.faults.efa_unhealthy)},
        "compute_fleet_status": "RUNNING",
        "ready_at": None,
        "ready_at_epoch": None,
    }


def _provision(spec: ClusterSpec, paths: ClusterPaths) -> dict:
    _make_dirs(paths, spec)
    slot = allocate_slot(paths.home, spec.name, count_compute_nodes(spec), ssh_port())
    head_name = head_hostname(slot)
    nodes = compute_nodes(spec, slot)
    runtime = _runtime_doc(spec, paths, slot, head_name, nodes)
    head = runtime["head_node"]
    head["instance_id"], head["launch_time"] = runtime_aws(runtime).run_instance(
        spec.name, "HeadNode", spec.head_instance_type, head_name)
    save_runtime(paths, runtime)
    paths.hosts_file.write_text(hosts_file_text(head_name, slot.head_ip, nodes))
    paths.hosts_file.chmod(0o644)
    mounts = list(spec.mount_dirs)
    user = runtime["ssh_user"]
    node_root.build(paths, user, head, runtime["nodes"])
    for knob, targets in (("neuron-unhealthy", spec.faults.neuron_unhealthy),
                          ("efa-unhealthy", spec.faults.efa_unhealthy)):
        try:   # before any instance is launched: a NODE target binds to the node's first instance
            node_faults.set_targets(paths, knob, targets, [n.name for n in nodes])
        except ValueError as error:
            raise RuntimeProvisionError(str(error)) from None

    munge.create_munge_key(paths)
    munge.start_munged(paths)

    acct = None
    if spec.accounting:
        acct = accounting.create_cluster_database(paths.home, spec.name)
        paths.slurmdbd_conf.write_text(render_slurmdbd_conf(paths, slot, head_name, acct))
        paths.slurmdbd_conf.chmod(0o600)
        dbd = head_launch(paths, head_name, "slurmdbd", ["/usr/sbin/slurmdbd", "-D"], mounts,
                          extra_env={"SLURM_CONF": str(paths.slurm_conf)})
        if not wait_listening(slot.head_ip, slot.slurmdbd_port, timeout=30, pid=dbd.pid):
            raise RuntimeProvisionError(f"slurmdbd did not start; see {paths.logs}/slurmdbd.log")

    paths.slurm_conf.write_text(render_slurm_conf(spec, paths, slot, head_name, nodes, acct))
    paths.slurm_conf.chmod(0o644)
    paths.slurm_daemon_conf.write_text(render_slurm_conf(spec, paths, slot, head_name, nodes, acct, daemons=True))
    paths.slurm_daemon_conf.chmod(0o644)
    _write_power_scripts(paths, resume_timeout(spec))
    (paths.spool / "slurmctld").mkdir(exist_ok=True)
    ctld = head_launch(paths, head_name, "slurmctld",
                       ["/usr/sbin/slurmctld", "-D", "-c", "-f", str(paths.slurm_daemon_conf)], mounts)
    if not wait_listening(slot.head_ip, slot.slurmctld_port, timeout=30, pid=ctld.pid):
        raise RuntimeProvisionError(f"slurmctld did not start; see {paths.logs}/slurmctld.log")

    static = [n for n in nodes if not n.dynamic]
    for node in static:
        start_slurmd(paths, node.name, mounts, fresh_boot=False, instance=instances.launch(paths, runtime, node))
    if static and not wait_nodes_state(paths, [n.name for n in static], {"idle"}, NODE_READY_TIMEOUT_S):
        raise RuntimeProvisionError(f"static nodes did not become idle; see {paths.logs}/slurmd-*.log")

    prepare_shared_home(paths, user)
    sshd.create_host_key(paths)
    sshd.install_authorized_key(paths, spec.key_name)
    sshd.write_sshd_config(paths, slot.head_ip, ssh_port(), user)
    sshd.start_sshd(paths, head_name, slot.head_ip, ssh_port(), mounts)

    if spec.alarms:   # after the head node, as the stack's alarms depend on its wait condition
        runtime_aws(runtime).put_head_node_alarms(spec.name, head["instance_id"], with_heartbeat=spec.log_group)
    _start_clustermgtd(paths)
    runtime["ready_at"] = utc_now_iso()
    runtime["ready_at_epoch"] = time.time()
    return runtime


def _start_helper(paths: ClusterPaths, module: str) -> subprocess.Popen:
    """A cluster daemon of the runtime's own (clustermgtd.py, agent.py), stopped by teardown."""
    from .nodes import Launched, record_daemon
    with open(paths.logs / f"{module}.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-I", "-m", f"localcluster.runtime.{module}", str(paths.root)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=dict(os.environ), cwd="/")
    record_daemon(paths, module, Launched(pid=proc.pid, uts_ns=0, mnt_ns=0))
    return proc


def _start_clustermgtd(paths: ClusterPaths) -> None:
    """Running before the cluster is complete, as supervisord starts it during the head node's bootstrap."""
    proc = _start_helper(paths, "clustermgtd")
    stream = clustermgtd.log_stream(paths)
    deadline = time.monotonic() + HELPER_START_TIMEOUT_S
    while not stream.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeProvisionError(f"clustermgtd did not start; see {paths.logs}/clustermgtd.log")
        time.sleep(0.1)
