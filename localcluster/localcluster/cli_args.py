"""The pcluster CLI's argument types and shared options, with pcluster's own error messages."""
from __future__ import annotations

import argparse
import re
from functools import partial
from pathlib import Path
from typing import Any

CLUSTER_NAME_PATTERN = "^[a-zA-Z][a-zA-Z0-9-]+$"
SUPPRESS_PATTERN = "^(ALL|type:[A-Za-z0-9]+)$"


REGION_PATTERN = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")


class Failure(Exception):
    """Print payload as JSON and exit 1."""

    def __init__(self, payload: dict[str, Any] | str) -> None:
        self.payload = payload if isinstance(payload, dict) else {"message": payload}
        super().__init__(self.payload.get("message", ""))


# --- argument types (same messages as pcluster's entrypoint) -------------------------------------

def _matching(pattern: str, param: str, value: str) -> str:
    if re.match(pattern, value) is None:
        raise Failure(f"Bad Request: '{value}' does not match '{pattern}' - '{param}'")
    return value


def _boolean(param: str, value: str) -> bool:
    if value in {"false", "False", "FALSE"}:
        return False
    if value in {"true", "True", "TRUE"}:
        return True
    raise Failure(f"Bad Request: Wrong type, expected 'boolean' for parameter '{param}'")


def _file_text(_param: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise Failure(f"Bad Request: File not found: '{path}'") from None


def _add_common(sub: argparse.ArgumentParser, region: bool = True) -> None:
    if region:
        sub.add_argument("-r", "--region", type=partial(_matching, r"^[a-zA-Z0-9-]+$", "region"),
                         help="AWS Region that the operation corresponds to.")
    sub.add_argument("--debug", action="store_true", default=False, help="Turn on debug logging.")
    sub.add_argument("--query", help="JMESPath query to perform on output.")


def _add_name(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("-n", "--cluster-name", required=True, type=partial(_matching, CLUSTER_NAME_PATTERN,
                     "cluster-name"), help="Name of the cluster")


def resolve_region(explicit: str | None, config_region: str | None = None) -> str:
    """The command's region: --region, else the configuration's Region, else the environment's."""
    from .aws import region_from_env

    if explicit and config_region and explicit != config_region:
        raise Failure("Bad Request: region is set in both parameter and configuration and conflicts.")
    region = explicit or config_region or region_from_env()
    if not REGION_PATTERN.match(region):
        raise Failure(f"Bad Request: invalid or unsupported region '{region}'")
    return region
