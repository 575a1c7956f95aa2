"""Hooks: the I/O, one method per API verb or command; they decide nothing."""

# The head node's SSH connection: here, so operators can name it as a default without importing a hook.
DEFAULT_SSH_CONN_ID = "ultracluster_head_node"
