"""The command type and the quoting helpers every remote command builder shares."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


@dataclass(frozen=True)
class RemoteCommand:
    """A command for the head node's shell: a non-login one (SSH exec), so PATH holds no /opt/slurm/bin.

    ``shell`` is the exact text run; ``stdin`` carries data (possibly secret) written to the
    command's standard input.
    """

    shell: str
    description: str
    stdin: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.description


def from_argv(*argv: str, description: str | None = None) -> RemoteCommand:
    shell = shlex.join(str(word) for word in argv)
    return RemoteCommand(shell=shell, description=description or shell)


def check_job_id(job_id: str | int) -> str:
    text = str(job_id)
    if not _JOB_ID.match(text):
        raise ValueError(f"Not a Slurm job id: {text!r}")
    return text


def env_words(env: Mapping[str, str]) -> list[str]:
    """``env NAME=value ...`` (checked names and values) to put before a command; none for no env."""
    assignments: list[str] = []
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"Invalid environment variable name for the job: {name!r}")
        if "\n" in str(value) or "\x00" in str(value):
            raise ValueError(f"Environment variable {name} holds a newline or NUL byte")
        assignments.append(f"{name}={value}")
    return ["env", *assignments] if assignments else []
