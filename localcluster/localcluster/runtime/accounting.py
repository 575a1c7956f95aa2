"""Slurm accounting: one MariaDB server shared by all clusters (like pcluster's external database),
each cluster its own database and its own slurmdbd. The server runs while some cluster has a database:
the last cluster's delete stops it (nothing left behind)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from .errors import RuntimeProvisionError
from .procs import kill_pids, pid_alive, read_pid, tcp_port_free, wait_listening
from .slots import shared_service_port
from .slurmconf import Accounting, slurm_cluster_name

DB_USER = "slurm"
MARIADB_PORT_OFFSET = 50


def mariadb_dir(home: Path) -> Path:
    return home / "mariadb"


def mariadb_port() -> int:
    return int(os.environ.get("LOCAL_UC_DB_PORT", shared_service_port(MARIADB_PORT_OFFSET)))


def _socket(home: Path) -> Path:
    return mariadb_dir(home) / "run" / "mysqld.sock"


def _pid_file(home: Path) -> Path:
    return mariadb_dir(home) / "run" / "mysqld.pid"


def _write_config(home: Path, port: int) -> Path:
    base = mariadb_dir(home)
    config = base / "my.cnf"
    config.write_text("\n".join([
        "[mysqld]",
        "user=mysql",
        f"datadir={base / 'data'}",
        f"socket={_socket(home)}",
        f"pid-file={_pid_file(home)}",
        f"log-error={base / 'log' / 'mysqld.err'}",
        f"port={port}",
        "bind-address=127.0.0.1",
        "skip-name-resolve",
        # Keep it light: this machine has 2 cores.
        "performance_schema=OFF",
        "innodb_buffer_pool_size=32M",
        "innodb_log_file_size=16M",
        "max_connections=100",
        "",
    ]))
    return config


def _client(home: Path, sql: str) -> str:
    done = subprocess.run(["mariadb", "--no-defaults", "-S", str(_socket(home)), "-u", "root", "-N", "-e", sql],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeProvisionError(f"mariadb: {done.stderr.strip()}")
    return done.stdout


def mariadb_running(home: Path) -> int | None:
    pid = read_pid(_pid_file(home))
    return pid if pid and pid_alive(pid) else None


def _password_file(home: Path) -> Path:
    return mariadb_dir(home) / "slurm.password"


@contextlib.contextmanager
def _server_lock(home: Path):
    """One process at a time starts, stops or changes the databases of the shared server."""
    mariadb_dir(home).mkdir(parents=True, exist_ok=True)
    with open(home / "mariadb.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _ensure_mariadb(home: Path) -> tuple[int, str]:
    """Start the shared server if needed (under ``_server_lock``); returns (port, password of the slurm
    DB user)."""
    base = mariadb_dir(home)
    port = mariadb_port()
    if mariadb_running(home):
        return port, _password_file(home).read_text().strip()
    mysql = pwd.getpwnam("mysql")
    for sub in ("data", "run", "log"):
        (base / sub).mkdir(exist_ok=True)
        os.chown(base / sub, mysql.pw_uid, mysql.pw_gid)
    config = _write_config(home, port)
    if not (base / "data" / "mysql").is_dir():
        done = subprocess.run(["mariadb-install-db", f"--defaults-file={config}", "--skip-test-db",
                               "--auth-root-authentication-method=socket"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeProvisionError(f"mariadb-install-db failed: {done.stderr[-2000:]}")
    if not tcp_port_free(port, "127.0.0.1"):
        raise RuntimeProvisionError(f"port {port} for MariaDB is taken")
    with open(base / "log" / "mariadbd.out", "ab") as out:
        proc = subprocess.Popen(["/usr/sbin/mariadbd", f"--defaults-file={config}"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, cwd="/")
    if not wait_listening("127.0.0.1", port, timeout=60, pid=proc.pid):
        proc.kill()
        raise RuntimeProvisionError(f"MariaDB did not start; see {base / 'log' / 'mysqld.err'}")
    deadline = time.monotonic() + 10
    while not _socket(home).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    password_file = _password_file(home)
    if not password_file.exists():
        password_file.write_text(secrets.token_hex(16))
        password_file.chmod(0o600)
    password = password_file.read_text().strip()
    _client(home, f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}';"
                  f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}';")
    return port, password


def database_name(cluster_name: str) -> str:
    return "slurm_acct_" + slurm_cluster_name(cluster_name)


def create_cluster_database(home: Path, cluster_name: str) -> Accounting:
    db = database_name(cluster_name)
    with _server_lock(home):
        port, password = _ensure_mariadb(home)
        # A fresh cluster starts with fresh accounting, as a new pcluster cluster would.
        _client(home, f"DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}`;"
                      f"GRANT ALL ON `{db}`.* TO '{DB_USER}'@'127.0.0.1';")
    return Accounting(db_host="127.0.0.1", db_port=port, db_user=DB_USER, db_password=password, db_name=db)


def drop_cluster_database(home: Path, cluster_name: str) -> None:
    """The cluster's database goes with it; the last one's takes the server along."""
    with _server_lock(home):
        if not mariadb_running(home):
            return
        _client(home, f"DROP DATABASE IF EXISTS `{database_name(cluster_name)}`;")
        if not _client(home, "SHOW DATABASES LIKE 'slurm\\_acct\\_%';").strip():
            stop_mariadb(home)


def stop_mariadb(home: Path) -> list[str]:
    pid = mariadb_running(home)
    if not pid:
        return []
    kill_pids([pid], grace=20.0)
    return [f"mariadbd[{pid}]"]


def remove_mariadb(home: Path) -> None:
    stop_mariadb(home)
    shutil.rmtree(mariadb_dir(home), ignore_errors=True)
