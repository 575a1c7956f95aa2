"""What bench/scale.py measures around the product's code: calls (SSH connections, remote commands,
pcluster CLI runs, AWS requests) by wrapping the client libraries the hooks use, memory read from /proc,
the per-node logs that reached S3, and the product parsers' cost on a cluster's real output."""
from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from pathlib import Path

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from botocore.endpoint import Endpoint

from ultracluster import remote_commands as rc
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.parsers.files import parse_file_listing
from ultracluster.parsers.slurm import parse_sinfo, parse_squeue
from ultracluster.run.contracts import select_artifacts
from ultracluster.run.fleet import partition_capacity

# ------------------------------------------------------------------------------- counting

class Calls:
    """Counts of SSH connections, remote commands and pcluster CLI runs, by wrapping the client calls."""
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def install(self) -> None:
        import asyncssh
        import paramiko


        counts = self.counts

        def wrap(owner, name, key, is_async=False):
            real = getattr(owner, name)
            if is_async:
                async def counted(*a, **kw):
                    counts[key] += 1
                    return await real(*a, **kw)
            else:
                def counted(*a, **kw):
                    counts[key] += 1
                    return real(*a, **kw)
            setattr(owner, name, counted)

        wrap(paramiko.SSHClient, "connect", "ssh_connections")
        wrap(paramiko.SSHClient, "exec_command", "remote_commands")
        wrap(paramiko.SSHClient, "open_sftp", "sftp_sessions")
        wrap(asyncssh, "connect", "ssh_connections", is_async=True)
        wrap(asyncssh, "get_server_host_key", "ssh_connections", is_async=True)
        wrap(asyncssh.SSHClientConnection, "create_session", "remote_commands", is_async=True)
        wrap(ParallelClusterHook, "_run", "pcluster_cli")
        wrap(ParallelClusterHook, "_arun", "pcluster_cli", is_async=True)

        wrap(Endpoint, "make_request", "aws_api")  # every AWS API request of this process (S3 here)

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)


# ------------------------------------------------------------------------------- memory

def _rss_kib(pid: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cluster_rss(home: Path) -> dict[str, float]:
    """RSS (MiB) of the processes belonging to this home (cmdline or environment names it), by program."""
    needle = str(home).encode()
    by_name: dict[str, float] = defaultdict(float)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if needle in cmdline or needle in environ:
            if name.startswith("python"):  # the stand-in's own moto and cluster worker, not a node
                name = "moto" if b"moto_server" in cmdline else "python"
            by_name[name] += _rss_kib(pid) / 1024
    return dict(by_name)


def used_memory_mib() -> float:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


# ------------------------------------------------------------------------------- results

def nodes_logged(train: dict, nodes: int) -> int:
    """Per-node logs that reached S3 (moto), the proof collect_results took every node's log."""
    keys = S3Hook(aws_conn_id="aws_default").list_keys("ultracluster-artifacts", prefix="scale/") or []
    wanted = {f"log_ph1_bf16_{i}_{nodes}" for i in range(nodes)}
    return len({k.rsplit("/", 1)[-1] for k in keys} & wanted)


def time_parsers(slurm, train: dict, rounds: int = 200) -> dict[str, float]:
    """Microseconds per parse of this cluster's real sinfo, squeue and output listing (product parsers)."""
    run = slurm.head_node_hook.check
    texts = {"sinfo": run(rc.sinfo()).stdout, "squeue": run(rc.squeue_job(train["job_id"])).stdout,
             "listing": run(rc.list_files(train["output_dir"])).stdout}
    work = {
        "sinfo": lambda: partition_capacity(parse_sinfo(texts["sinfo"]), None, 1),
        "squeue": lambda: parse_squeue(texts["squeue"]),
        "listing": lambda: select_artifacts(parse_file_listing(texts["listing"])),
    }
    timed = {}
    for label, call in work.items():
        start = time.perf_counter()
        for _ in range(rounds):
            call()
        timed[label] = (time.perf_counter() - start) / rounds * 1e6
    return timed
