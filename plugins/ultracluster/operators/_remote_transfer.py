"""Transfers the head node runs for an operator (curl to or from S3), stoppable from the worker.

Closing an SSH channel does not stop a remote curl writing to a file: ``remote_commands.cancellable``
runs it in a process group whose id goes to a pid file, and ``HeadNodeHook.stop_remote_transfer``
stops that group. A try stops an earlier try's transfer before it starts its own (two curls would
write the same .part file); a kill or a failed try stops its own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ultracluster import remote_commands

if TYPE_CHECKING:
    from ultracluster.hooks.head_node import HeadNodeHook
    from ultracluster.remote_commands import RemoteCommand


class RemoteTransferMixin:
    ssh_conn_id: str
    head_node: Any
    log: Any
    _pid_file: str | None = None  # set while a transfer of this try runs

    def run_transfer(self, head_node: HeadNodeHook, command: RemoteCommand, pid_file: str, *, timeout: float) -> None:
        self._pid_file = pid_file
        try:
            head_node.check(remote_commands.cancellable(command, pid_file), timeout=timeout)
        except Exception:
            # Timeout or SSH loss: the detached curl may still run; the retry must not meet it.
            self._stop_transfer(head_node, pid_file)
            raise
        finally:
            self._pid_file = None

    def on_kill(self) -> None:
        """Stop the remote curl: closing the SSH channel alone would leave it running."""
        if self._pid_file:
            from ultracluster.hooks.head_node import HeadNodeHook

            # A fresh connection: the task's own one is busy in the blocked execute().
            self._stop_transfer(HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node), self._pid_file)

    def _stop_transfer(self, head_node: HeadNodeHook, pid_file: str) -> None:
        try:
            head_node.stop_remote_transfer(pid_file)
            self.log.info("Stopped the remote transfer recorded in %s", pid_file)
        except Exception:
            self.log.exception("Could not stop the remote transfer recorded in %s", pid_file)
