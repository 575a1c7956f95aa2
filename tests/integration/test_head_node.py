"""HeadNodeHook against a REAL sshd on loopback (own host key, own authorized key, port 47100-47200):
the pinned host key is accepted, any other key is refused - sync (paramiko) and async (asyncssh)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ultracluster import remote_commands as rc
from ultracluster.hooks.head_node import HeadNodeHook, HeadNodeUnreachableError, HostKeyMismatchError

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(not os.path.exists(SSHD) or os.geteuid() != 0, reason="needs sshd and root")


def free_port(low: int = 47100, high: int = 47200) -> int:
    for port in range(low, high):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in range")


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


class LoopbackSshd:
    """sshd on 127.0.0.1 with its own host key and one authorized client key; stopped by pid."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.host_key = keygen(root / "host_ed25519")
        self.client_key_path = root / "client_ed25519"
        keygen(self.client_key_path)
        (root / "authorized_keys").write_text((root / "client_ed25519.pub").read_text())
        (root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_ed25519'}\n"
            f"PidFile {root / 'sshd.pid'}\nAuthorizedKeysFile {root / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\nLogLevel VERBOSE\n"
        )
        self.pid: int | None = None

    def start(self) -> None:
        os.makedirs("/run/sshd", exist_ok=True)
        subprocess.run([SSHD, "-f", str(self.root / "sshd_config"), "-E", str(self.root / "sshd.log")], check=True)
        for _ in range(100):
            pid_file = self.root / "sshd.pid"
            if pid_file.exists() and pid_file.read_text().strip():
                self.pid = int(pid_file.read_text())
                break
            time.sleep(0.05)
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("sshd did not start: " + (self.root / "sshd.log").read_text())

    def stop(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.pid = None

    def connection_env(self, conn_id: str, **extra) -> dict[str, str]:
        conn = {
            "conn_type": "ssh", "login": os.environ.get("USER", "root") if os.geteuid() else "root",
            "port": self.port, "extra": {"key_file": str(self.client_key_path), **extra},
        }
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn)}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = LoopbackSshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def conn(sshd, monkeypatch):
    for name, value in sshd.connection_env("uc_test_head").items():
        monkeypatch.setenv(name, value)
    return "uc_test_head"


# Any harmless command with a known answer.
PROBE = rc.sha256_of("/dev/null")
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def head(sshd, host_key: str | None = None) -> dict:
    return {"cluster_name": "c1", "address": "127.0.0.1", "host_key": host_key or sshd.host_key}


def test_async_first_contact_matches(sshd):
    assert asyncio.run(HeadNodeHook.afetch_host_key("127.0.0.1", sshd.port)) == sshd.host_key


def test_run_with_pinned_key(sshd, conn):
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd))
    result = hook.run(PROBE)
    assert result.exit_status == 0 and result.stdout.startswith(EMPTY_SHA256)
    failing = hook.run(rc.sha256_of("/nonexistent/file"))
    assert failing.exit_status != 0 and "No such file" in failing.stderr
    hook.close()


# 4 MiB on stderr, then 4 MiB on stdout: each is twice paramiko's 2 MiB channel window, so a reader
# that drains one stream before the other stalls until its timeout.
BIG = 4 << 20
BIG_OUTPUT = rc.RemoteCommand(
    shell=f"head -c {BIG} /dev/zero | tr '\\0' e >&2; head -c {BIG} /dev/zero | tr '\\0' o; exit 3",
    description="4 MiB to stderr, then 4 MiB to stdout",
)


def test_run_reads_large_stdout_and_stderr_together(sshd, conn):
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd))
    started = time.monotonic()
    result = hook.run(BIG_OUTPUT, timeout=20)
    assert time.monotonic() - started < 20
    assert result.exit_status == 3
    assert result.stderr == "e" * BIG and result.stdout == "o" * BIG
    assert hook.run(PROBE).stdout.startswith(EMPTY_SHA256)  # the connection is still usable
    hook.close()


def test_arun_reads_large_stdout_and_stderr_together(sshd, conn):
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd))
    started = time.monotonic()
    result = asyncio.run(hook.arun(BIG_OUTPUT, timeout=20))
    assert time.monotonic() - started < 20
    assert result.exit_status == 3
    assert result.stderr == "e" * BIG and result.stdout == "o" * BIG


def test_wrong_host_key_is_refused_sync(sshd, conn, tmp_path):
    other = keygen(tmp_path / "other")
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd, other))
    with pytest.raises(HostKeyMismatchError, match="not the key pinned") as refused:
        hook.run(PROBE)
    # Deterministic: the task fails without its retries (AirflowFailException).
    from airflow.sdk.exceptions import AirflowFailException

    assert isinstance(refused.value, AirflowFailException)


@pytest.fixture
def home_known_hosts(monkeypatch, tmp_path):
    """A HOME whose ~/.ssh/known_hosts the test fills (what SSHHook/paramiko would read)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home / ".ssh" / "known_hosts"


def test_known_hosts_cannot_make_another_key_pass(sshd, conn, tmp_path, home_known_hosts):
    """known_hosts vouches for the server's real key, but the run pinned another: refused."""
    home_known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key}\n")
    other = keygen(tmp_path / "other")
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd, other))
    with pytest.raises(HostKeyMismatchError, match="not the key pinned"):
        hook.run(PROBE)


def test_stale_known_hosts_entry_cannot_make_the_pinned_key_fail(sshd, conn, tmp_path, home_known_hosts):
    """A leftover known_hosts entry (an earlier head node at this address) is not consulted."""
    stale = keygen(tmp_path / "stale")
    home_known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {stale}\n127.0.0.1 {stale}\n")
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd))
    assert hook.run(PROBE).stdout.startswith(EMPTY_SHA256)
    hook.close()


def test_connection_extras_cannot_disable_pinning(sshd, monkeypatch, tmp_path):
    for name, value in sshd.connection_env("uc_test_nocheck", no_host_key_check="true").items():
        monkeypatch.setenv(name, value)
    other = keygen(tmp_path / "other")
    with pytest.raises(HostKeyMismatchError):
        HeadNodeHook(ssh_conn_id="uc_test_nocheck", head_node=head(sshd, other)).run(PROBE)
    with pytest.raises(HostKeyMismatchError):
        asyncio.run(HeadNodeHook(ssh_conn_id="uc_test_nocheck", head_node=head(sshd, other)).arun(PROBE))
    assert HeadNodeHook(ssh_conn_id="uc_test_nocheck", head_node=head(sshd)).run(PROBE).ok


def test_async_run_with_pinned_key_and_stdin(sshd, conn, tmp_path):
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd))
    target = tmp_path / "written"

    async def scenario():
        async with hook.aconnection() as connection:
            written = await hook.arun(rc.write_file(str(target), "secret-ish body\n"), conn=connection)
            read = await hook.arun(rc.read_file(str(target)), conn=connection)
            return written, read

    written, read = asyncio.run(scenario())
    assert written.exit_status == 0 and read.stdout == "secret-ish body\n"


def test_wrong_host_key_is_refused_async(sshd, conn, tmp_path):
    other = keygen(tmp_path / "other")
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd, other))
    with pytest.raises(HostKeyMismatchError):
        asyncio.run(hook.arun(PROBE))


def test_put_file_and_stdin(sshd, conn, tmp_path):
    hook = HeadNodeHook(ssh_conn_id=conn, head_node=head(sshd))
    local = tmp_path / "run.sh"
    local.write_text("#!/bin/bash\necho hi\n")
    remote = tmp_path / "remote dir" / "run.sh"
    hook.check(rc.make_dirs(str(remote.parent)))
    hook.put_file(str(local), str(remote), mode=0o755)
    hook.put_file(str(local), str(remote), mode=0o755)  # idempotent: replaces, never half-writes
    assert remote.read_text() == local.read_text() and os.access(remote, os.X_OK)
    assert not (remote.parent / ".run.sh.part").exists()
    data = tmp_path / "data.txt"
    data.write_text("x\n")
    hook.put_files([(str(local), str(remote), 0o644), (str(data), str(remote.parent / "data.txt"), None)])
    assert not os.access(remote, os.X_OK) and (remote.parent / "data.txt").read_text() == "x\n"
    assert sorted(p.name for p in remote.parent.iterdir()) == ["data.txt", "run.sh"]
    hook.check(rc.write_file(str(tmp_path / "m.json"), '{"a": 1}'))
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": 1}


def test_unreachable_is_its_own_error(sshd, monkeypatch):
    dead_port = free_port(47180, 47200)
    monkeypatch.setenv(
        "AIRFLOW_CONN_UC_TEST_DEAD",
        json.dumps({"conn_type": "ssh", "login": "root", "port": dead_port,
                    "extra": {"key_file": str(sshd.client_key_path)}}),
    )
    hook = HeadNodeHook(ssh_conn_id="uc_test_dead", head_node=head(sshd), conn_timeout=3)
    with pytest.raises(HeadNodeUnreachableError):
        hook.run(PROBE)
    with pytest.raises(HeadNodeUnreachableError):
        asyncio.run(hook.arun(PROBE))


@pytest.mark.parametrize(
    "bad", [None, {}, {"address": "1.2.3.4"}, {"address": "1.2.3.4", "host_key": "AAAAonlyone"}]
)
def test_head_node_without_pinned_key_is_refused(bad):
    with pytest.raises(ValueError):
        HeadNodeHook(ssh_conn_id="x", head_node=bad)
