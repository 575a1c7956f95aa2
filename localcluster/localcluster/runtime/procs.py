"""Process helpers: PID files, namespaces, killing by PID, port checks."""
from __future__ import annotations

import errno
import os
import signal
import socket
import time
from pathlib import Path


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def wait_for_pid_file(pid_file: Path, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = read_pid(pid_file)
        if pid and pid_alive(pid):
            return pid
        time.sleep(0.05)
    return None


def ns_inode(pid: int, kind: str = "uts") -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def shared_uts_inodes() -> set[int]:
    """UTS namespaces that are not ours to sweep: the one we run in and init's."""
    return {ino for ino in (ns_inode(os.getpid()), ns_inode(1)) if ino is not None}


def file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def sees_hosts_file(pid: int, identity: tuple[int, int]) -> bool:
    """Whether /etc/hosts inside the process's mount namespace is this cluster's hosts file."""
    return file_identity(Path(f"/proc/{pid}/root/etc/hosts")) == identity


def pids_in_namespaces(uts_inodes: set[int], hosts_file: Path) -> list[int]:
    """Every process whose UTS namespace is one of ours (a node's daemon, job steps, ssh sessions).

    Namespace inode numbers are reused once a namespace dies, so a process also has to see this
    cluster's /etc/hosts. Never sweeps the namespace this process shares with the rest of the machine."""
    uts_inodes = {ino for ino in uts_inodes if ino} - shared_uts_inodes()
    identity = file_identity(hosts_file)
    if not uts_inodes or identity is None:
        return []
    found, mine = [], ancestors()
    for pid in all_pids():
        if pid in mine:
            continue
        ino = ns_inode(pid)
        if ino is not None and ino in uts_inodes and sees_hosts_file(pid, identity):
            found.append(pid)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ancestors() -> set[int]:
    """This process and its parents: never ours to kill, even if their command line names the dir."""
    chain, pid = set(), os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


# Only processes the runtime itself starts are swept by command line; a CLI worker naming the same
# directory (create/delete/fleet) is never a target.
SWEEPABLE_COMMANDS = ("slurmctld", "slurmd", "slurmstepd", "slurmdbd", "slurmscriptd", "munged", "sshd",
                      "unshare", "ns-exec.sh", "localcluster.runtime.power", "localcluster.runtime.agent",
                      "mariadbd")


def pids_mentioning(text: str) -> list[int]:
    """Runtime processes whose command line names `text` (e.g. a cluster dir): the fallback sweep."""
    mine = ancestors()
    found = []
    for pid in all_pids():
        command = cmdline(pid)
        if pid not in mine and text in command and any(c in command for c in SWEEPABLE_COMMANDS):
            found.append(pid)
    return found


def kill_pids(pids: list[int], grace: float = 3.0) -> list[int]:
    """TERM, wait up to `grace`, then KILL; grace 0 is KILL at once. Returns the PIDs that were alive."""
    never = ancestors()
    # Kernel threads have no command line; init and our own callers are never targets.
    alive = [p for p in pids if p > 1 and p not in never and cmdline(p) and pid_alive(p)]
    # No grace means a vanished machine: a TERM would let slurmstepd report the step's end first.
    for pid in alive if grace > 0 else []:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in alive):
        time.sleep(0.05)
    for pid in alive:
        if pid_alive(pid):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(pid_alive(p) for p in alive):
        time.sleep(0.05)
    return alive


def sigkill_now(pids: list[int]) -> None:
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def tcp_port_free(port: int, host: str) -> bool:
    """Whether `port` can be bound on `host` (a wildcard listener on the port also blocks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def tcp_listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def wait_listening(host: str, port: int, timeout: float, pid: int | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tcp_listening(host, port):
            return True
        if pid is not None and not pid_alive(pid):
            return False
        time.sleep(0.05)
    return False
