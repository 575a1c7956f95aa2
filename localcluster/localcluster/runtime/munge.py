"""One munged per cluster: its own key and socket, so clusters cannot authenticate to each other."""
from __future__ import annotations

import os
import subprocess
import time

from .errors import RuntimeProvisionError
from .nodes import Launched, record_daemon
from .paths import ClusterPaths

MUNGE_KEY_BYTES = 1024


def create_munge_key(paths: ClusterPaths) -> None:
    # munged refuses a socket dir that others cannot enter.
    for directory in (paths.munge_dir, paths.short_run):
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
    paths.short_run.parent.chmod(0o755)
    fd = os.open(paths.munge_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as key:
        key.write(os.urandom(MUNGE_KEY_BYTES))


def start_munged(paths: ClusterPaths) -> Launched:
    log = paths.logs / "munged.out"
    argv = ["/usr/sbin/munged", "--foreground", "--force", f"--socket={paths.munge_socket}",
            f"--key-file={paths.munge_key}", f"--pid-file={paths.pid_file('munged')}",
            f"--log-file={paths.logs}/munged.log", f"--seed-file={paths.munge_dir}/munged.seed",
            "--num-threads=2"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, cwd="/")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if paths.munge_socket.exists():
            launched = Launched(pid=proc.pid, uts_ns=0, mnt_ns=0)   # runs in the machine's namespaces
            record_daemon(paths, "munged", launched)
            return launched
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeProvisionError(f"munged did not start; see {log} and {paths.logs}/munged.log")
