"""Parses of the file commands ``remote_commands`` builds (listings, log chunks)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass


class FileOutputError(ValueError):
    """A file command printed something its parser does not understand."""


@dataclass(frozen=True)
class LogChunk:
    size: int  # the file's size now; -1 when it does not exist yet
    data: bytes  # bytes from the requested offset


def parse_log_chunk(stdout: str) -> LogChunk:
    """``read_log_chunk``: the size on the first line, then the bytes base64-encoded on one line."""
    lines = stdout.split("\n", 1)
    try:
        size = int(lines[0].strip())
    except ValueError:
        raise FileOutputError(f"Unexpected log read output: {stdout[:200]!r}") from None
    if size < 0:
        return LogChunk(-1, b"")
    try:
        data = base64.b64decode(lines[1].strip(), validate=True) if len(lines) > 1 else b""
    except binascii.Error as err:
        raise FileOutputError(f"Log chunk is not base64: {err}") from None
    return LogChunk(size, data)


def parse_file_listing(stdout: str) -> dict[str, int]:
    """``list_files``: ``<size> <relative path>`` per line -> {path: size} (paths may hold spaces)."""
    files: dict[str, int] = {}
    for line in stdout.splitlines():
        size, sep, path = line.partition(" ")
        if sep and size.isdigit():
            files[path] = int(size)
    return files


def parse_modified_times(stdout: str) -> dict[str, int]:
    """``modified_times``: path -> epoch seconds."""
    times = {}
    for line in stdout.splitlines():
        stamp, _, path = line.strip().partition(" ")
        if not path:
            continue
        try:
            times[path] = int(stamp)
        except ValueError:
            raise FileOutputError(f"Unexpected stat output: {line[:200]!r}") from None
    return times
