"""The head node's sshd: own host key, one authorized key, bound to the head node's IP."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .errors import RuntimeProvisionError
from .nodes import Launched, head_launch
from .paths import ClusterPaths
from .procs import kill_pids, wait_listening


def host_key(paths: ClusterPaths) -> Path:
    return paths.ssh_dir / "ssh_host_ed25519_key"


def create_host_key(paths: ClusterPaths) -> None:
    paths.ssh_dir.mkdir(parents=True, exist_ok=True)
    paths.ssh_dir.chmod(0o755)
    if not host_key(paths).exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"head@{paths.root.name}",
                        "-f", str(host_key(paths))], check=True, capture_output=True)


def install_authorized_key(paths: ClusterPaths, key_name: str) -> Path:
    public_key = paths.home / "keys" / f"{key_name}.pub"
    if not public_key.is_file():
        raise RuntimeProvisionError(f"key pair {key_name!r} has no public key at {public_key}")
    target = paths.ssh_dir / "authorized_keys"
    shutil.copyfile(public_key, target)
    target.chmod(0o644)
    return target


def write_sshd_config(paths: ClusterPaths, ip: str, port: int, user: str) -> Path:
    config = paths.ssh_dir / "sshd_config"
    config.write_text("\n".join([
        f"ListenAddress {ip}:{port}",
        f"HostKey {host_key(paths)}",
        f"PidFile {paths.pid_file('sshd')}",
        f"AuthorizedKeysFile {paths.ssh_dir / 'authorized_keys'}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "UsePAM no",
        # State lives under LOCAL_ULTRACLUSTER_HOME, which may sit below a world-writable /tmp.
        "StrictModes no",
        "PermitRootLogin no",
        f"AllowUsers {user}",
        "X11Forwarding no",
        "PrintMotd no",
        "MaxStartups 50:30:100",
        "Subsystem sftp internal-sftp",
        "",
    ]))
    return config


def start_sshd(paths: ClusterPaths, head_name: str, ip: str, port: int, mount_dirs: list[str]) -> Launched:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # privilege separation dir
    config = paths.ssh_dir / "sshd_config"
    launched = head_launch(paths, head_name, "sshd",
                           ["/usr/sbin/sshd", "-D", "-f", str(config), "-E", str(paths.logs / "sshd.log")],
                           mount_dirs)
    if not wait_listening(ip, port, timeout=10, pid=launched.pid):
        kill_pids([launched.pid])
        raise RuntimeProvisionError(f"sshd did not listen on {ip}:{port}; see {paths.logs}/sshd.log")
    return launched
