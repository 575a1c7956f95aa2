"""Errors raised by the runtime."""


class RuntimeProvisionError(RuntimeError):
    """Provisioning failed; whatever had been started was cleaned up."""
