"""SSH to a cluster's head node with its host key pinned.

The SSH connection (``ultracluster_head_node``) supplies user, private key and port; the address
comes from describe-cluster and the host key from first contact (``HeadNodeHook.afetch_host_key``,
in wait_for_fleet). Every later connection in the run expects exactly that key and fails on any
other: the connection's own ``no_host_key_check``/``host_key`` extras and known_hosts files are
overridden, never trusted.

Wraps the providers-ssh hooks: ``SSHHook`` (paramiko) in workers, ``SSHHookAsync`` (asyncssh) in
triggers. paramiko and asyncssh (and providers-ssh, which imports paramiko) load inside the methods
that use them: heavy libraries stay out of the DAG's parse (docs/architecture.md, "Imports").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import selectors
from base64 import b64decode
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException

from ultracluster import remote_commands
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.pinned_ssh import (
    afetch_host_key,
    fetch_host_key,
    pinned_async_hook_class,
    pinned_sync_hook_class,
)

if TYPE_CHECKING:
    import asyncssh
    import paramiko

    from ultracluster.remote_commands import RemoteCommand

# asyncssh logs every session and command at INFO ("[conn=0, chan=12] Command: scontrol ..."): one
# line per poll buries the job's progress in the task log. Warnings and errors still show.
_CHATTY_SSH_LOGGERS = ("asyncssh", "paramiko")
_READ_CHUNK = 1 << 20


class HostKeyMismatchError(AirflowFailException):
    """The head node presented a host key other than the one pinned at first contact. Deterministic
    (a retry meets the same key, or an attacker), so the task fails without retrying."""


class HeadNodeUnreachableError(Exception):
    """The head node could not be reached (network, sshd down); worth retrying later."""


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


def _validate_head_node(head_node: Mapping[str, Any] | None) -> dict[str, Any]:
    if not head_node:
        raise ValueError("head_node is required: the dict wait_for_fleet returns")
    missing = [key for key in ("address", "host_key") if not head_node.get(key)]
    if missing:
        raise ValueError(
            f"head_node lacks {missing}: host keys are pinned at first contact by wait_for_fleet, "
            "a head node without one is refused"
        )
    key_parts = str(head_node["host_key"]).split()
    if len(key_parts) < 2:
        raise ValueError("head_node host_key must look like 'ssh-ed25519 AAAA...'")
    return dict(head_node)


def _collect(channel: paramiko.Channel, idle_timeout: float) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr): both streams read together to EOF, as providers-ssh's
    ``exec_ssh_client_command`` does. They share the channel's flow-control window: a command filling
    one while only the other is read would stall. TimeoutError after ``idle_timeout`` s without output."""
    out, err = bytearray(), bytearray()

    def drain() -> None:
        while channel.recv_ready():
            out.extend(channel.recv(_READ_CHUNK))
        while channel.recv_stderr_ready():
            err.extend(channel.recv_stderr(_READ_CHUNK))

    with selectors.DefaultSelector() as selector:
        selector.register(channel, selectors.EVENT_READ)  # paramiko signals data on either stream
        while not (channel.eof_received or channel.closed):
            if not selector.select(idle_timeout):
                raise TimeoutError(f"no output for {idle_timeout:g}s")
            drain()
    drain()  # what arrived between the last drain and the EOF
    if not channel.status_event.wait(idle_timeout):
        raise TimeoutError(f"no exit status {idle_timeout:g}s after EOF")
    return channel.recv_exit_status(), bytes(out), bytes(err)


class HeadNodeHook(BaseHook):
    """Run commands on, and copy files to, one cluster's head node (host key pinned).

    :param ssh_conn_id: SSH connection: login, private key (``key_file`` or ``private_key``), port.
    :param head_node: ``{"cluster_name", "address", "host_key"}`` from wait_for_fleet.
    :param command_timeout: seconds one command may run.
    :param conn_timeout: seconds to establish the connection.
    """

    conn_name_attr = "ssh_conn_id"
    default_conn_name = DEFAULT_SSH_CONN_ID
    conn_type = "ssh"
    hook_name = "UltraCluster head node"

    def __init__(
        self,
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        head_node: Mapping[str, Any] | None = None,
        *,
        command_timeout: float = 900,
        conn_timeout: float = 30,
    ) -> None:
        super().__init__()
        for name in _CHATTY_SSH_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        self.ssh_conn_id = ssh_conn_id
        self.head_node = _validate_head_node(head_node)
        self.command_timeout = command_timeout
        self.conn_timeout = conn_timeout
        self._ssh_hook = None

    @property
    def address(self) -> str:
        return str(self.head_node["address"])

    @property
    def host_key(self) -> str:
        return " ".join(str(self.head_node["host_key"]).split()[:2])

    # ------------------------------------------------------------------------------- sync

    def get_ssh_hook(self):
        """providers-ssh SSHHook for this head node, expecting exactly the pinned host key."""
        if self._ssh_hook is None:
            import paramiko

            key_type, key_data = self.host_key.split()[:2]
            # One connect attempt: unreachable-host retries are the callers' (they back off across polls).
            self._ssh_hook = pinned_sync_hook_class()(
                ssh_conn_id=self.ssh_conn_id,
                remote_host=self.address,
                conn_timeout=int(self.conn_timeout),
                cmd_timeout=self.command_timeout,
                pinned_host_key=paramiko.PKey.from_type_string(key_type, b64decode(key_data)),
            )
        return self._ssh_hook

    def get_conn(self) -> paramiko.SSHClient:
        import paramiko

        try:
            return self.get_ssh_hook().get_conn()
        except paramiko.BadHostKeyException as err:
            raise HostKeyMismatchError(
                f"Head node {self.address} presented host key {err.key.get_name()} "
                f"{err.key.get_base64()[:16]}..., not the key pinned at first contact "
                f"({self.host_key[:40]}...). Refusing to connect."
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as err:
            if isinstance(err, paramiko.AuthenticationException):
                raise
            raise HeadNodeUnreachableError(f"Cannot reach head node {self.address}: {err}") from err

    def close(self) -> None:
        if self._ssh_hook is not None and self._ssh_hook.client is not None:
            self._ssh_hook.client.close()
            self._ssh_hook.client = None

    def run(self, command: RemoteCommand, *, timeout: float | None = None) -> CommandResult:
        """Run one command; its stdin (maybe a secret) is written, never logged."""
        import paramiko

        client = self.get_conn()
        self.log.debug("Head node %s: %s", self.address, command)
        try:
            stdin, stdout, stderr = client.exec_command(command.shell, timeout=timeout or self.command_timeout)
            if command.stdin is not None:
                stdin.write(command.stdin)
            stdin.channel.shutdown_write()
            exit_status, out, err = _collect(stdout.channel, timeout or self.command_timeout)
        except (OSError, paramiko.SSHException, EOFError) as error:
            self.close()
            raise HeadNodeUnreachableError(f"Lost head node {self.address} running {command}: {error}") from error
        return CommandResult(
            exit_status=exit_status,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def check(self, command: RemoteCommand, *, timeout: float | None = None) -> CommandResult:
        """``run`` that raises with the command's stderr on a non-zero exit."""
        result = self.run(command, timeout=timeout)
        if not result.ok:
            raise RuntimeError(
                f"`{command}` failed on head node {self.address} (exit {result.exit_status}): "
                f"{result.stderr.strip()[-2000:] or result.stdout.strip()[-2000:]}"
            )
        return result

    def put_file(self, local_path: str, remote_path: str, *, mode: int | None = None) -> None:
        """SFTP a file, written to a temp name then renamed: a rerun replaces it, never half-writes."""
        self.put_files([(local_path, remote_path, mode)])

    def put_files(self, files: Sequence[tuple[str, str, int | None]]) -> None:
        """``put_file`` for each (local path, remote path, mode), over one SFTP session."""
        with self.get_conn().open_sftp() as sftp:
            for local_path, remote_path, mode in files:
                tmp_path = posixpath.join(posixpath.dirname(remote_path), f".{posixpath.basename(remote_path)}.part")
                sftp.put(local_path, tmp_path)
                if mode is not None:
                    sftp.chmod(tmp_path, mode)
                sftp.posix_rename(tmp_path, remote_path)

    def stop_remote_transfer(self, pid_file: str) -> None:
        """Stop the process group a ``remote_commands.cancellable`` command recorded in ``pid_file``
        (a no-op when none runs). setsid detaches it from the SSH session, so a killed task or a
        lost worker leaves it running: on_kill calls this, and so does every try before it starts
        its own transfer (two curls would write the same .part file)."""
        self.check(remote_commands.kill_process_group(pid_file))

    # ------------------------------------------------------------------------------ async

    # First contact (hooks/pinned_ssh.py): the head node's key as "<type> <base64>", the pin.
    afetch_host_key = staticmethod(afetch_host_key)
    fetch_host_key = staticmethod(fetch_host_key)

    def get_async_hook(self):
        """providers-ssh SSHHookAsync for this head node, expecting exactly the pinned key."""
        return pinned_async_hook_class()(
            ssh_conn_id=self.ssh_conn_id, host=self.address, pinned_host_key=self.host_key
        )

    @contextlib.asynccontextmanager
    async def aconnection(self) -> AsyncIterator[asyncssh.SSHClientConnection]:
        """One asyncssh connection to reuse across several commands (a trigger's poll loop)."""
        import asyncssh

        try:
            conn = await asyncio.wait_for(self.get_async_hook().get_conn(), timeout=self.conn_timeout)
        except asyncssh.HostKeyNotVerifiable as err:
            raise HostKeyMismatchError(
                f"Head node {self.address} did not present the host key pinned at first contact: {err}"
            ) from None
        except (TimeoutError, OSError, asyncssh.Error) as err:
            raise HeadNodeUnreachableError(f"Cannot reach head node {self.address}: {err!r}") from err
        try:
            yield conn
        finally:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    async def arun(
        self,
        command: RemoteCommand,
        *,
        conn: asyncssh.SSHClientConnection | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run one command over asyncssh (on ``conn`` when given, else a fresh connection)."""
        import asyncssh

        if conn is None:
            async with self.aconnection() as fresh:
                return await self.arun(command, conn=fresh, timeout=timeout)
        try:
            result = await conn.run(
                command.shell, input=command.stdin, check=False, timeout=timeout or self.command_timeout
            )
        except (TimeoutError, OSError, asyncssh.Error) as err:
            raise HeadNodeUnreachableError(f"Lost head node {self.address} running {command}: {err!r}") from err
        stdout, stderr = result.stdout or "", result.stderr or ""
        # Killed by a signal: exit_status is -1/None; report it as a failure, never as 0.
        exit_status = result.exit_status if result.exit_status is not None and result.exit_status >= 0 else 255
        return CommandResult(
            exit_status=exit_status,
            stdout=stdout if isinstance(stdout, str) else stdout.decode("utf-8", "replace"),
            stderr=stderr if isinstance(stderr, str) else stderr.decode("utf-8", "replace"),
        )
