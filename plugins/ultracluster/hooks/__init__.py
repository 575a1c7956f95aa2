"""Hooks: the I/O. Every hook module loads inside tasks and triggers, never at parse time."""

# The head node's SSH connection: here, so operators can name it as a default without importing a hook.
DEFAULT_SSH_CONN_ID = "ultracluster_head_node"
