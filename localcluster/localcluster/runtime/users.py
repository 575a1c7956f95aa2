"""The cluster user (Image.Os's default user, e.g. ubuntu): a real account whose home lives in each
cluster's /home; its sudo rights exist only inside the nodes (node_root.py)."""
from __future__ import annotations

import os
import pwd
import subprocess
import time

from .errors import RuntimeProvisionError
from .paths import ClusterPaths


def ensure_user(user: str) -> pwd.struct_passwd:
    for _ in range(5):
        try:
            return pwd.getpwnam(user)
        except KeyError:
            pass
        # -M: the home directory exists only inside the cluster's namespaces (/home is bind-mounted).
        done = subprocess.run(["useradd", "-M", "-U", "-d", f"/home/{user}", "-s", "/bin/bash", user],
                              capture_output=True, text=True)
        if done.returncode == 0:
            # A locked password ('!') makes sshd refuse keys too; '*' only disables passwords.
            subprocess.run(["usermod", "-p", "*", user], check=True, capture_output=True)
        else:
            time.sleep(0.2)   # another cluster may be creating it at the same moment
    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise RuntimeProvisionError(f"could not create user {user}") from None


def prepare_shared_home(paths: ClusterPaths, user: str) -> None:
    account = ensure_user(user)
    home = paths.shared_home / user
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    paths.shared_home.chmod(0o755)
    for path in (home, home / ".ssh"):
        os.chown(path, account.pw_uid, account.pw_gid)
    home.chmod(0o755)
    (home / ".ssh").chmod(0o700)
