"""The host key pin: first contact with a head node, and providers-ssh hooks that trust only the pin.

paramiko and asyncssh (and providers-ssh's hooks, which import paramiko) are heavy: they load inside
these functions, never at the DAG's parse (docs/architecture.md, "Imports").
"""
from __future__ import annotations

import asyncio
import socket
from typing import Any

# Preferred first, the same for both first contacts: one head node pins the same key either way.
HOST_KEY_ALGORITHMS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256")


async def afetch_host_key(address: str, port: int, timeout: float = 10) -> str:
    """First contact over asyncssh: the head node's host key as ``"<type> <base64>"`` (the pin)."""
    import asyncssh

    fetch = asyncssh.get_server_host_key(address, port, server_host_key_algs=list(HOST_KEY_ALGORITHMS))
    key = await asyncio.wait_for(fetch, timeout)
    if key is None:
        raise OSError(f"{address}:{port} offered no host key")
    key_type, key_data = key.export_public_key("openssh").decode().split()[:2]
    return f"{key_type} {key_data}"


def fetch_host_key(address: str, port: int, timeout: float = 10) -> str:
    """First contact over paramiko (a worker's wait): the key as ``"<type> <base64>"``."""
    import paramiko

    with socket.create_connection((address, port), timeout=timeout) as sock:
        transport = paramiko.Transport(sock)
        try:
            options = transport.get_security_options()
            options.key_types = [t for t in HOST_KEY_ALGORITHMS if t in options.key_types]
            transport.start_client(timeout=timeout)
            key = transport.get_remote_server_key()
        except paramiko.SSHException as err:
            raise OSError(f"{address}:{port}: no host key ({err})") from err
        finally:
            transport.close()
    return f"{key.get_name()} {key.get_base64()}"


def pinned_sync_hook_class():
    """SSHHook whose only known host key is the pinned one.

    SSHHook.get_conn loads ~/.ssh/known_hosts, which paramiko consults before the hook's own key:
    an entry there would accept another key or refuse the pinned one. This get_conn builds the
    paramiko client without any known_hosts file.
    """
    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook

    class _PinnedKeyPolicy(paramiko.MissingHostKeyPolicy):
        """Called (before authentication) when the server offers another key type than the pin's."""

        def __init__(self, pinned: paramiko.PKey) -> None:
            self.pinned = pinned

        def missing_host_key(self, client, hostname, key) -> None:
            if key != self.pinned:
                raise paramiko.BadHostKeyException(hostname, key, self.pinned)

    class PinnedSSHHook(SSHHook):
        def __init__(self, *, pinned_host_key: paramiko.PKey, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.pinned_host_key = pinned_host_key
            # The connection may say no_host_key_check/allow_host_key_change/host_key: the pin wins.
            self.host_key = pinned_host_key
            self.no_host_key_check = False
            self.allow_host_key_change = False

        def get_conn(self) -> paramiko.SSHClient:
            if self.client:
                transport = self.client.get_transport()
                if transport and transport.is_active():
                    return self.client
            pinned = self.pinned_host_key
            client = paramiko.SSHClient()  # no load_system_host_keys: the pin is the only authority
            host = self.remote_host if int(self.port) == 22 else f"[{self.remote_host}]:{self.port}"
            # A known entry also makes paramiko ask the server for the pin's key type first.
            client.get_host_keys().add(host, pinned.get_name(), pinned)
            client.set_missing_host_key_policy(_PinnedKeyPolicy(pinned))
            kwargs: dict[str, Any] = {
                "hostname": self.remote_host,
                "port": self.port,
                "username": self.username,
                "timeout": self.conn_timeout,
                "compress": self.compress,
                "sock": self.host_proxy,
                "look_for_keys": self.look_for_keys,
                "banner_timeout": self.banner_timeout,
                "auth_timeout": self.auth_timeout,
            }
            if self.password:
                kwargs["password"] = self.password.strip()
            if self.pkey:
                kwargs["pkey"] = self.pkey
            if self.key_file:
                kwargs["key_filename"] = self.key_file
            if self.disabled_algorithms:
                kwargs["disabled_algorithms"] = self.disabled_algorithms
            try:
                client.connect(**kwargs)
                server_key = client.get_transport().get_remote_server_key()
                if server_key != pinned:  # belt and braces: nothing runs on another key
                    raise paramiko.BadHostKeyException(host, server_key, pinned)
            except BaseException:
                client.close()
                raise
            if self.keepalive_interval:
                client.get_transport().set_keepalive(self.keepalive_interval)
            if self.ciphers:
                client.get_transport().get_security_options().ciphers = self.ciphers
            self.client = client
            return client

    return PinnedSSHHook


def pinned_async_hook_class():
    """SSHHookAsync whose known hosts are always exactly the pinned key."""
    from airflow.providers.ssh.hooks.ssh import SSHHookAsync

    class PinnedSSHHookAsync(SSHHookAsync):
        def __init__(self, *, pinned_host_key: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._pinned_host_key = pinned_host_key
            self._pin()

        def _pin(self) -> None:
            import asyncssh

            key = asyncssh.import_public_key(self._pinned_host_key)
            # Lists (trusted keys, CA keys, revoked keys) skip name matching: this key, for this
            # connection, whatever port it runs on.
            self.known_hosts = ([key], [], [])  # type: ignore[assignment]

        def _parse_extras(self, conn: Any) -> None:
            super()._parse_extras(conn)
            # The connection may say no_host_key_check/host_key; the pinned key wins.
            self._pin()

    return PinnedSSHHookAsync


