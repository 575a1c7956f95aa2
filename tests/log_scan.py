"""The secrets scan of the end-to-end runs' logs (docs/operations.md, "What the task logs show").

``scan(texts, known)`` reads every text (a task log, a component log, an XCom) and reports each
line that holds an AWS access key id (``AKIA``/``ASIA`` + 16), a secret access key or session token
printed with its name, a presigned URL's signature or credential (``X-Amz-Signature=``,
``X-Amz-Credential=``, ``X-Amz-Security-Token=``, the V2 ``Signature=``/``AWSAccessKeyId=``), a local
fake credential (its ``ucfake`` marker: tests/fixtures_localcluster.py's ``FAKE_AWS``), or any of the
deployment's own secret values passed in ``known`` (its AWS keys, the passwords file's values, the
SSH key). Airflow's masked form (``***``) is not a leak. A finding names the text, the line and the
kind, never the secret: the report is printed by a failing test.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

FAKE_MARKER = "ucfake"   # in every local fake credential, whatever its case
_MASKED = r"(?!\*{3})"
PATTERNS = {
    "access key id": re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"),
    "secret access key": re.compile(
        rf"(?i)(?:aws_secret_access_key|secret_access_key|secretaccesskey|secret_key)[\"']?\s*[:=]\s*[\"']?{_MASKED}"
        r"[A-Za-z0-9/+]{16,}"),
    "session token": re.compile(
        rf"(?i)(?:aws_session_token|session_token|sessiontoken|security_token)[\"']?\s*[:=]\s*[\"']?{_MASKED}"
        r"[A-Za-z0-9/+=%]{16,}"),
    "presigned URL signature": re.compile(
        r"X-Amz-(?:Signature|Credential|Security-Token)=|[?&](?:Signature|AWSAccessKeyId)=", re.IGNORECASE),
    "local fake credential": re.compile(re.escape(FAKE_MARKER), re.IGNORECASE),
}


@dataclass(frozen=True)
class Finding:
    where: str
    line: int
    kind: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.kind}"


def scan(texts: Mapping[str, str], known: Mapping[str, str] | None = None) -> list[Finding]:
    """Every line of ``texts`` (name -> text) that holds a secret; ``known``: name -> secret value,
    each reported by its name (values shorter than 8 characters would match by chance and are refused)."""
    known = {name: value for name, value in (known or {}).items() if value}
    short = [name for name, value in known.items() if len(value) < 8]
    if short:
        raise ValueError(f"secrets too short to look for: {short}")
    found = []
    for where, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            kinds = [kind for kind, pattern in PATTERNS.items() if pattern.search(line)]
            kinds += [name for name, value in known.items() if value in line]
            found += [Finding(where, number, kind) for kind in kinds]
    return found


def read_logs(root: Path, skip: Iterable[str] = ()) -> dict[str, str]:
    """Every file under ``root`` (task logs, component logs), by its path below it, but those named in ``skip``."""
    return {str(path.relative_to(root)): path.read_text(errors="replace")
            for path in sorted(root.rglob("*")) if path.is_file() and path.name not in set(skip)}
