"""Slot allocation: slot k gives IPs 127.100.k.x and a block of ports, claimed under a file lock."""
from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import RuntimeProvisionError
from .procs import tcp_port_free, tcp_listening

PORTS_PER_SLOT = 100
SLURMCTLD_OFFSET = 0
SLURMDBD_OFFSET = 1
SLURMD_OFFSET = 10           # compute node i (1-based) gets offset 10 + i
MAX_COMPUTE_NODES = PORTS_PER_SLOT - SLURMD_OFFSET - 1


def slot_range() -> range:
    low = int(os.environ.get("LOCAL_UC_SLOT_MIN", "1"))
    high = int(os.environ.get("LOCAL_UC_SLOT_MAX", "99"))
    if not 1 <= low <= high <= 254:
        raise RuntimeProvisionError(f"bad slot range {low}..{high} (must be within 1..254)")
    return range(low, high + 1)


def port_base() -> int:
    return int(os.environ.get("LOCAL_UC_PORT_BASE", "20000"))


@dataclass(frozen=True)
class Slot:
    index: int
    first_port: int

    @property
    def head_ip(self) -> str:
        return f"127.100.{self.index}.1"

    def compute_ip(self, node_number: int) -> str:
        return f"127.100.{self.index}.{10 + node_number}"

    @property
    def slurmctld_port(self) -> int:
        return self.first_port + SLURMCTLD_OFFSET

    @property
    def slurmdbd_port(self) -> int:
        return self.first_port + SLURMDBD_OFFSET

    def slurmd_port(self, node_number: int) -> int:
        return self.first_port + SLURMD_OFFSET + node_number


def slot_for(index: int) -> Slot:
    return Slot(index=index, first_port=port_base() + index * PORTS_PER_SLOT)


@contextmanager
def _locked(home: Path) -> Iterator[Path]:
    slots_dir = home / "slots"
    slots_dir.mkdir(parents=True, exist_ok=True)
    with open(slots_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield slots_dir
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _slot_usable(slot: Slot, node_count: int, ssh_port: int) -> bool:
    # Each daemon binds only its own address (CommunicationParameters=NoInAddrAny,NoCtldInAddrAny).
    wanted = [(slot.head_ip, slot.slurmctld_port), (slot.head_ip, slot.slurmdbd_port)]
    wanted += [(slot.compute_ip(i), slot.slurmd_port(i)) for i in range(1, node_count + 1)]
    if not all(tcp_port_free(port, ip) for ip, port in wanted):
        return False
    return not tcp_listening(slot.head_ip, ssh_port)


def allocate_slot(home: Path, cluster_name: str, node_count: int, ssh_port: int) -> Slot:
    if node_count > MAX_COMPUTE_NODES:
        raise RuntimeProvisionError(
            f"{node_count} compute nodes requested; the local UltraCluster holds at most {MAX_COMPUTE_NODES}")
    with _locked(home) as slots_dir:
        for index in slot_range():
            claim = slots_dir / f"{index}.json"
            if claim.exists():
                owner = json.loads(claim.read_text() or "{}").get("cluster")
                if owner == cluster_name:
                    return slot_for(index)
                continue
            slot = slot_for(index)
            if not _slot_usable(slot, node_count, ssh_port):
                continue
            claim.write_text(json.dumps({"cluster": cluster_name, "pid": os.getpid()}))
            return slot
    raise RuntimeProvisionError("no free slot: every slot in range is taken or its ports are in use")


def free_slot(home: Path, cluster_name: str) -> None:
    with _locked(home) as slots_dir:
        for claim in slots_dir.glob("*.json"):
            try:
                owner = json.loads(claim.read_text() or "{}").get("cluster")
            except ValueError:
                owner = None
            if owner == cluster_name:
                claim.unlink(missing_ok=True)


def shared_service_port(offset: int) -> int:
    """Slot 0 is never given to a cluster, so its block holds services all clusters share."""
    return port_base() + offset
