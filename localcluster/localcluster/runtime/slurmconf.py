"""slurm.conf / slurmdbd.conf for one cluster, shaped like the ones ParallelCluster writes."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..spec import ClusterSpec
from .layout import ComputeNode
from .paths import NODE_SPOOL_DIR, ClusterPaths
from .slots import Slot

CPUS_PER_NODE = 2            # what this machine has; every node advertises the same
SUSPEND_TIMEOUT_S = 5        # how long a node stays "powering down" (idle%) before it is idle~ again
SLURMD_TIMEOUT_S = 60


@dataclass(frozen=True)
class Accounting:
    db_host: str
    db_port: int
    db_user: str
    db_password: str
    db_name: str


def resume_timeout(spec: ClusterSpec) -> int:
    """ResumeTimeout is the compute node bootstrap timeout, as the cookbook's slurm_parallelcluster.conf has it."""
    return int(spec.compute_node_bootstrap_timeout)


def slurm_cluster_name(name: str) -> str:
    """Slurm lowercases ClusterName; keep it a plain identifier."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def suspend_time_seconds(idletime_min: float) -> int:
    return max(1, int(math.ceil(idletime_min * 60)))


def _node_line(node: ComputeNode) -> str:
    features = ",".join(["dynamic" if node.dynamic else "static", node.instance_type, node.resource])
    state = "CLOUD" if node.dynamic else "UNKNOWN"
    return (f"NodeName={node.name} NodeAddr={node.ip} NodeHostname={node.name} Port={node.port} "
            f"CPUs={CPUS_PER_NODE} State={state} Feature={features}")


def render_slurm_conf(spec: ClusterSpec, paths: ClusterPaths, slot: Slot, head_name: str,
                      nodes: list[ComputeNode], accounting: Accounting | None, daemons: bool = False) -> str:
    """slurm.conf for clients; with `daemons`, the copy slurmctld and slurmd read (-f)."""
    static = [n.name for n in nodes if not n.dynamic]
    lines = [
        f"# Local UltraCluster {spec.name} (slot {slot.index})",
        f"ClusterName={slurm_cluster_name(spec.name)}",
        f"SlurmctldHost={head_name}({slot.head_ip})",
        f"SlurmctldPort={slot.slurmctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        f"StateSaveLocation={paths.spool}/slurmctld",
        f"SlurmdSpoolDir={NODE_SPOOL_DIR}",
        f"SlurmctldPidFile={paths.pid_file('slurmctld')}",
        f"SlurmdPidFile={paths.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={paths.logs}/slurmctld.log",
        f"SlurmdLogFile={paths.logs}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        # slurmd puts its own conf (slurm-daemons.conf) in SLURM_CONF of every job; tasks get this one back.
        f"TaskProlog={paths.bin}/task-prolog",
        "MailProg=/bin/true",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        # One hop from slurmctld to every node, as pcluster configures for cloud nodes.
        "TreeWidth=65533",
        # Daemons bind the address their hostname resolves to (their 127.100.k.x), not 0.0.0.0. Clients
        # (srun) must not: all nodes share one network namespace, so srun's connections leave from
        # 127.0.0.1 and slurmstepd connects back to that address, which an srun bound to its node IP refuses.
        "CommunicationParameters=NoAddrCache" + (",NoInAddrAny,NoCtldInAddrAny" if daemons else ""),
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        # A killed node ends its job as NODE_FAIL instead of silently requeueing it.
        "JobRequeue=0",
        "PrivateData=cloud",
        f"ResumeProgram={paths.bin}/resume",
        f"SuspendProgram={paths.bin}/suspend",
        # A node not up by ResumeTimeout: pcluster's slurm.conf hands it to slurm_suspend, and clustermgtd
        # replaces it; both are local power.py's resume-fail.
        f"ResumeFailProgram={paths.bin}/resume-fail",
        f"ResumeTimeout={resume_timeout(spec)}",
        # Ends when the job's nodes are up, so Slurm 22.05 launches it then, not at its next 30 s check.
        f"PrologSlurmctld={paths.bin}/ctld-prolog",
        f"SuspendTimeout={SUSPEND_TIMEOUT_S}",
        f"SuspendTime={suspend_time_seconds(spec.scaledown_idletime_min)}",
        "ResumeRate=0",
        "SuspendRate=0",
        "SlurmctldParameters=idle_on_node_suspend,power_save_interval=1",
    ]
    if static:
        lines.append("SuspendExcNodes=" + ",".join(static))
    if accounting is None:
        lines += ["JobCompType=jobcomp/filetxt", f"JobCompLoc={paths.logs}/jobcomp.log"]
    else:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={slot.head_ip}",   # resolvable from the host too (sacct there)
            f"AccountingStoragePort={slot.slurmdbd_port}",
            # slurmctld authenticates to slurmdbd through this munge socket.
            f"AccountingStoragePass={paths.munge_socket}",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=30",
        ]
    lines += [_node_line(n) for n in nodes]
    for i, queue in enumerate(spec.queues):
        members = [n.name for n in nodes if n.queue == queue.name]
        default = "YES" if i == 0 else "NO"
        lines.append(f"PartitionName={queue.name} Nodes={','.join(members)} Default={default} "
                     "MaxTime=INFINITE State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"


def render_slurmdbd_conf(paths: ClusterPaths, slot: Slot, head_name: str, accounting: Accounting) -> str:
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        f"DbdHost={head_name}",
        f"DbdAddr={slot.head_ip}",
        f"DbdPort={slot.slurmdbd_port}",
        # slurmdbd then binds the head IP its hostname resolves to, not 0.0.0.0.
        "CommunicationParameters=NoInAddrAny",
        "SlurmUser=root",
        f"PidFile={paths.pid_file('slurmdbd')}",
        f"LogFile={paths.logs}/slurmdbd.log",
        "StorageType=accounting_storage/mysql",
        f"StorageHost={accounting.db_host}",
        f"StoragePort={accounting.db_port}",
        f"StorageUser={accounting.db_user}",
        f"StoragePass={accounting.db_password}",
        f"StorageLoc={accounting.db_name}",
    ]
    return "\n".join(lines) + "\n"
