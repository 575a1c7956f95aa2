"""Deploy-time profiles: the DAG's param defaults per environment (production, local, ...).

``load_profile()`` reads ``include/profiles/<name>.json`` where name is the argument, else
``$ULTRACLUSTER_PROFILE``, else ``production``. String values may reference the environment:
``"${VAR}"`` (VAR must be set) or ``"${VAR:-fallback}"`` (fallback when VAR is unset or empty),
anywhere inside the string.

``$ULTRACLUSTER_INCLUDE_DIR`` overrides where include/ is (default: the repository's include/,
found next to the plugins/ project).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

DEFAULT_PROFILE = "production"
PROFILE_ENV_VAR = "ULTRACLUSTER_PROFILE"
INCLUDE_DIR_ENV_VAR = "ULTRACLUSTER_INCLUDE_DIR"

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ProfileError(ValueError):
    """A profile is missing, malformed, or references an unset environment variable."""


def include_dir() -> Path:
    """The include/ directory: templates, training files and profiles."""
    override = os.environ.get(INCLUDE_DIR_ENV_VAR)
    if override:
        return Path(override)
    # plugins/ultracluster/run/profiles.py -> <repo>/include
    return Path(__file__).resolve().parents[3] / "include"


def _expand(value: Any, where: str) -> Any:
    if isinstance(value, str):
        def substitute(match: re.Match) -> str:
            name, fallback = match.group(1), match.group(2)
            current = os.environ.get(name)
            if current:
                return current
            if fallback is not None:
                return fallback
            raise ProfileError(f"{where}: environment variable {name} is not set (use ${{{name}:-default}})")

        return _ENV_REFERENCE.sub(substitute, value)
    if isinstance(value, list):
        return [_expand(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {key: _expand(item, f"{where}.{key}") for key, item in value.items()}
    return value


def load_profile(name: str | None = None) -> dict:
    """Param defaults of a profile, environment references expanded."""
    name = name or os.environ.get(PROFILE_ENV_VAR) or DEFAULT_PROFILE
    if not _PROFILE_NAME.match(name):
        raise ProfileError(f"Invalid profile name {name!r}")
    path = include_dir() / "profiles" / f"{name}.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ProfileError(f"Profile {name!r} not found at {path}") from err
    except json.JSONDecodeError as err:
        raise ProfileError(f"Profile {path} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ProfileError(f"Profile {path} must hold a JSON object")
    # Keys starting with "_" are comments for humans.
    return _expand({k: v for k, v in raw.items() if not k.startswith("_")}, name)
