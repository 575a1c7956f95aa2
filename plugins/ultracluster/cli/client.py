"""The `ultracluster` CLI's connection to Airflow's REST API v2: httpx, a JWT from ``POST /auth/token``.

Every failure the user can act on is a :class:`CliError`: one line on stderr, exit code 2.
"""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_USERNAME = "admin"
DEFAULT_DAG = "trn1_bert_pretrain"
ENV_URL = "ULTRACLUSTER_AIRFLOW_URL"
ENV_USERNAME = "ULTRACLUSTER_AIRFLOW_USERNAME"
ENV_PASSWORD = "ULTRACLUSTER_AIRFLOW_PASSWORD"
# The simple auth manager keeps its users' passwords in the file this setting names; without it,
# Airflow generates GENERATED_PASSWORDS_FILE in AIRFLOW_HOME.
PASSWORDS_FILE_SETTING = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
GENERATED_PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
# The local deployment's environment (AIRFLOW_HOME, the passwords file, ...), in the checkout.
LOCAL_ENV_SCRIPT = "scripts/env.sh"


class CliError(Exception):
    """A failure the user can act on: printed as one line on stderr, exit code 2."""


def segment(value: str) -> str:
    """``value`` as one URL path segment (run ids carry ':' and '+', which stay readable)."""
    return quote(value, safe=":+")


def render_detail(detail: Any) -> str:
    """The server's ``detail`` on one readable line: a string (its first paragraph: jsonschema's
    messages go on with the whole schema), a list of pydantic errors (``loc: msg; ...``) or a dict."""
    if isinstance(detail, list):
        return "; ".join(_render_error(err) for err in detail) or "(no detail)"
    if isinstance(detail, dict):
        if "reason" in detail:  # Airflow's database conflicts: {"reason", "statement", "orig_error"}
            return " ".join(str(detail[k]) for k in ("reason", "orig_error") if detail.get(k))
        return json.dumps(detail, sort_keys=True)
    text = str(detail).strip().split("\n\n", 1)[0]
    return " ".join(text.split())


def _render_error(err: Any) -> str:
    if not isinstance(err, dict) or "msg" not in err:
        return render_detail(err)
    loc = ".".join(str(part) for part in err.get("loc") or () if part != "body")
    return f"{loc}: {err['msg']}" if loc else str(err["msg"])


def checkout_root() -> Path | None:
    """The checkout this package runs from (`make setup` installs it editable from ``plugins/``), or
    None for an installed package."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / LOCAL_ENV_SCRIPT).is_file() else None


def env_script_setting(checkout: Path, environ: Mapping[str, str]) -> str | None:
    """``PASSWORDS_FILE_SETTING`` as the checkout's scripts/env.sh sets it in ``environ``: the
    script stays the one home of the local deployment's layout, and a fresh shell that did not
    source it finds the same file `make up` wrote."""
    try:
        done = subprocess.run(["bash", "-c", f'. "$1" >/dev/null 2>&1; printf %s "${PASSWORDS_FILE_SETTING}"', "-",
                               str(checkout / LOCAL_ENV_SCRIPT)], env=dict(environ), capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def passwords_files(environ: Mapping[str, str] | None = None, checkout: Path | None = None) -> list[Path]:
    """Where a local deployment keeps its passwords, in the order they are tried: the file the
    environment names; else the one the checkout's scripts/env.sh names, then the file Airflow
    generates in AIRFLOW_HOME."""
    environ = os.environ if environ is None else environ
    if environ.get(PASSWORDS_FILE_SETTING):
        return [Path(environ[PASSWORDS_FILE_SETTING])]
    named = env_script_setting(checkout, environ) if checkout else None
    home = Path(environ.get("AIRFLOW_HOME") or Path(environ.get("HOME") or Path.home()) / "airflow").expanduser()
    return [*([Path(named)] if named else []), home / GENERATED_PASSWORDS_FILE]


def local_password(username: str, files: Sequence[Path]) -> str | None:
    """The password of ``username`` in the first of ``files`` that has one (``passwords_files``), or
    None. Lets `ultracluster` log in on the local deployment with no password given."""
    for path in files:
        try:
            password = json.loads(path.read_text()).get(username)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(password, str) and password:
            return password
    return None


class AirflowClient:
    """Calls on one Airflow API server as one user; logs in on first use and again when the token
    expires (a long follow can outlive it)."""

    def __init__(self, base: str, username: str, password: str | None, *, timeout: float = 30.0,
                 looked_in: Sequence[Path] = ()) -> None:
        self.base = base.rstrip("/")
        self.username = username
        self.password = password
        self.looked_in = list(looked_in)  # the passwords files tried when no password was given
        self._token: str | None = None
        self._http = httpx.Client(base_url=self.base, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def ui_url(self, dag_id: str, run_id: str) -> str:
        return f"{self.base}/dags/{segment(dag_id)}/runs/{segment(run_id)}"

    def login(self) -> None:
        if not self.password:
            tried = f" (none in {', '.join(map(str, self.looked_in))})" if self.looked_in else ""
            raise CliError(f"no password for Airflow user {self.username!r}: pass --password or set {ENV_PASSWORD}"
                           f"{tried}")
        resp = self._send("POST", "/auth/token", {"username": self.username, "password": self.password}, None)
        if resp.status_code in (401, 403):
            raise CliError(f"Airflow at {self.base} refused the credentials of user {self.username!r} "
                           f"(HTTP {resp.status_code}: {_detail(resp)}); check --username/--password "
                           f"or {ENV_USERNAME}/{ENV_PASSWORD}")
        token = self._json(resp, "POST", "/auth/token").get("access_token")
        if not token:
            raise CliError(f"POST {self.base}/auth/token answered without an access_token: is this Airflow 3?")
        self._token = token

    def call(self, method: str, path: str, body: dict | None = None, *, params: dict | None = None,
             missing_ok: bool = False) -> dict | None:
        """The JSON answer of one call; None for a 404 when ``missing_ok``; a CliError otherwise."""
        if self._token is None:
            self.login()
        resp = self._send(method, path, body, params)
        if resp.status_code == 401:  # the token expired: log in again, once
            self.login()
            resp = self._send(method, path, body, params)
        if resp.status_code == 404 and missing_ok:
            return None
        return self._json(resp, method, path)

    def get(self, path: str, *, params: dict | None = None, missing_ok: bool = False) -> dict | None:
        return self.call("GET", path, params=params, missing_ok=missing_ok)

    def post(self, path: str, body: dict) -> dict:
        return self.call("POST", path, body)

    def patch(self, path: str, body: dict) -> dict:
        return self.call("PATCH", path, body)

    def _send(self, method: str, path: str, body: dict | None, params: dict | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            return self._http.request(method, path, json=body, params=params, headers=headers)
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise CliError(f"cannot reach the Airflow API at {self.base} ({reason}); is Airflow up? "
                           f"(--url or {ENV_URL})") from None

    def _json(self, resp: httpx.Response, method: str, path: str) -> dict:
        if resp.status_code >= 400:
            raise CliError(_failure(resp, method, path, self.username))
        if not resp.content:
            return {}
        try:
            return resp.json()
        except ValueError:
            raise CliError(f"{method} {self.base}{path} did not answer JSON (HTTP {resp.status_code}): "
                           f"is {self.base} an Airflow API server?") from None


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return " ".join(resp.text.split())[:200] or resp.reason_phrase
    return render_detail(body.get("detail", body) if isinstance(body, dict) else body)


def _failure(resp: httpx.Response, method: str, path: str, username: str) -> str:
    code, call = resp.status_code, f"{method} {path}"
    if code in (400, 409, 422):
        head = f"Airflow rejected {call}"
    elif code == 404:
        head = f"not found: {call}"
    elif code == 403:
        head = f"user {username!r} may not {call}"
    else:
        head = f"{call} failed"
    return f"{head} (HTTP {code}): {_detail(resp)}"
