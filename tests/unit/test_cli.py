"""`ultracluster` trigger, status and report, its errors and its console script, against a real HTTP
server: a stub of Airflow's REST API v2 (tests/unit/airflow_stub.py). Exact requests, output, exit codes."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.fixtures_localcluster import free_port
from tests.unit.airflow_stub import (DAG, PASSWORD, RUN, RUN_ID, StubAirflow, cli, one_error_line, run, timeless, tis,
                                    token_request)
from tests.unit.airflow_stub import no_ambient_config, stub  # noqa: F401 - fixtures
from ultracluster.cli import main
from ultracluster.cli.client import (
    GENERATED_PASSWORDS_FILE,
    LOCAL_ENV_SCRIPT,
    PASSWORDS_FILE_SETTING,
    checkout_root,
    passwords_files,
    render_detail,
)

REPO = Path(__file__).resolve().parents[2]

# trigger


def test_trigger_unpauses_triggers_and_follows_a_run_to_success(stub, tmp_path, capsys):
    conf_file = tmp_path / "conf.json"
    conf_file.write_text(json.dumps({"num_nodes": 2, "model_size": "tiny"}))
    stub.on("GET", DAG, (200, {"dag_id": "trn1_bert_pretrain", "is_paused": True}))
    stub.on("PATCH", DAG, (200, {"dag_id": "trn1_bert_pretrain", "is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", run(RUN_ID, "queued"))
    stub.on("GET", RUN, run(RUN_ID, "queued"), run(RUN_ID, "running"), run(RUN_ID, "success"))
    stub.on("GET", f"{RUN}/taskInstances?limit=100", tis(),
            tis(("create_vpc", "running", None), ("train", None, None)),
            tis(("create_vpc", "success", 12.0), ("train", "success", 40.0)))
    stub.on("GET", f"{RUN}/taskInstances/collect_results/xcomEntries/return_value",
            (200, {"key": "return_value", "value": {"final_loss": 8.01, "nodes": 2}}))
    stub.on("GET", f"{RUN}/taskInstances/delete_cluster/xcomEntries/return_value",
            (200, {"key": "return_value", "value": {"deleted": True, "usage": {
                "usd": 1.23, "compute_usd": 1.0, "head_node_usd": 0.2, "fsx_usd": 0.03, "instance_hours": 0.3,
                "compute_node_hours": 0.2, "head_node_hours": 0.1, "instances": 3}}}))

    code = cli(stub, "trigger", "--conf-file", str(conf_file), "--param", "num_nodes=4", "--param", "note=hello",
               "--param", 'sweep={"id": "s1", "point": {"num_nodes": 4}}')

    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    conf = {"num_nodes": 4, "model_size": "tiny", "note": "hello", "sweep": {"id": "s1", "point": {"num_nodes": 4}}}
    assert stub.requests == [
        token_request(),
        ("GET", DAG, None),
        ("PATCH", DAG, {"is_paused": False}),
        ("POST", f"{DAG}/dagRuns", {"logical_date": None, "conf": conf}),
        *[("GET", RUN, None), ("GET", f"{RUN}/taskInstances?limit=100", None)] * 3,
        ("GET", f"{RUN}/taskInstances/collect_results/xcomEntries/return_value", None),
        # The run summary: the other tasks whose XComs it reads (records.XCOM_TASKS).
        *[("GET", f"{RUN}/taskInstances/{task}/xcomEntries/return_value", None)
          for task in ("preflight", "pcluster_create", "wait_for_fleet", "train", "delete_cluster")],
    ]
    summary = out.split("\nRun summary:\n", 1)[1]
    assert "  cost               $1.23 from EC2 instance lives (compute $1.00, head node $0.20, FSx $0.03)" in summary
    assert "  instance-hours     0.300 (compute nodes 0.200, head node 0.100; 3 instances)" in summary
    assert timeless(out.split("\nRun summary:\n", 1)[0]) == (
        "unpaused trn1_bert_pretrain\n"
        f"triggered trn1_bert_pretrain run {RUN_ID} (conf {json.dumps(conf, sort_keys=True)})\n"
        f"  {stub.url}/dags/trn1_bert_pretrain/runs/{RUN_ID}\n"
        "  create_vpc             running            Ts\n"
        "  create_vpc             success            Ts\n"
        "  train                  success            Ts\n"
        f"run {RUN_ID} finished: success in T s\n"
        "\nResults (collect_results):\n"
        "  final_loss  8.01\n"
        "  nodes       2\n")


def test_a_failed_run_exits_1(stub, capsys):
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", run(RUN_ID, "queued"))
    stub.on("GET", RUN, run(RUN_ID, "running"), run(RUN_ID, "failed"))
    stub.on("GET", f"{RUN}/taskInstances?limit=100", tis(("create_vpc", "running", None)),
            tis(("create_vpc", "failed", 3.0), ("delete_vpc", "success", 1.0)))

    assert cli(stub, "trigger", "--results", "") == 1
    out = timeless(capsys.readouterr().out)
    assert out.endswith("  create_vpc             failed             Ts\n  delete_vpc             success            Ts\n"
                        f"run {RUN_ID} finished: failed in T s\n"), out
    assert not any("xcomEntries" in path for _, path, _ in stub.requests)


def test_no_follow_prints_the_run_and_returns(stub, capsys):
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", run(RUN_ID, "queued"))

    assert cli(stub, "trigger", "--no-follow") == 0
    assert stub.requests == [token_request(), ("GET", DAG, None),
                             ("POST", f"{DAG}/dagRuns", {"logical_date": None, "conf": {}})]
    assert capsys.readouterr().out == (f"triggered trn1_bert_pretrain run {RUN_ID} (conf {{}})\n"
                                       f"  {stub.url}/dags/trn1_bert_pretrain/runs/{RUN_ID}\n")


def test_an_expired_token_is_renewed_while_following(stub, capsys):
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", run(RUN_ID, "queued"))
    stub.on("GET", RUN, run(RUN_ID, "running"), StubAirflow.expire_tokens, run(RUN_ID, "success"))
    stub.on("GET", f"{RUN}/taskInstances?limit=100", tis(("train", "success", 1.0)))

    assert cli(stub, "trigger", "--results", "") == 0
    assert [request for request in stub.requests if request[1] in ("/auth/token", RUN)] == [
        token_request(), ("GET", RUN, None), ("GET", RUN, None), token_request(), ("GET", RUN, None)]


def test_a_dag_airflow_does_not_know(stub, capsys):
    assert cli(stub, "trigger") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"Airflow at {stub.url} has no DAG 'trn1_bert_pretrain': is its file in the DAGs folder, "
        "and parsed without import errors?")


# errors: one line on stderr, exit 2


def test_bad_credentials(stub, capsys):
    assert cli(stub, "status", RUN_ID, password="wrong") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"Airflow at {stub.url} refused the credentials of user 'admin' (HTTP 401: Invalid credentials); "
        "check --username/--password or ULTRACLUSTER_AIRFLOW_USERNAME/ULTRACLUSTER_AIRFLOW_PASSWORD")
    assert stub.requests == [("POST", "/auth/token", {"username": "admin", "password": "wrong"})]


def test_unreachable_api_names_the_url(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["--url", url, "--password", PASSWORD, "status", RUN_ID]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"cannot reach the Airflow API at {url} ("), line
    assert line.endswith("is Airflow up? (--url or ULTRACLUSTER_AIRFLOW_URL)"), line


def test_a_rejected_conf_prints_the_servers_message(stub, capsys):
    # Airflow's ParamValidationError text: jsonschema's message, then the schema and the instance.
    detail = ("Invalid input for param sweep: 'S 1' does not match '^[a-z0-9][a-z0-9-]{0,39}$'\n\n"
              "Failed validating 'pattern' in schema['properties']['id']:\n    {'type': 'string'}\n\n"
              "On instance['id']:\n    'S 1'")
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", (400, {"detail": detail}))

    assert cli(stub, "trigger", "--param", 'sweep={"id": "S 1", "num_nodes": [1]}') == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"Airflow rejected POST {DAG}/dagRuns (HTTP 400): "
        "Invalid input for param sweep: 'S 1' does not match '^[a-z0-9][a-z0-9-]{0,39}$'")


def test_a_422_lists_pydantics_errors_readably(stub, capsys):
    stub.on("GET", DAG, (200, {"is_paused": False}))
    stub.on("POST", f"{DAG}/dagRuns", (422, {"detail": [
        {"type": "dict_type", "loc": ["body", "conf"], "msg": "Input should be a valid dictionary", "input": 3},
        {"type": "extra_forbidden", "loc": ["body", "foo"], "msg": "Extra inputs are not permitted", "input": 1}]}))

    assert cli(stub, "trigger") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"Airflow rejected POST {DAG}/dagRuns (HTTP 422): conf: Input should be a valid dictionary; "
        "foo: Extra inputs are not permitted")


def test_render_detail_shapes():
    assert render_detail("a\n  b\n\nschema...") == "a b"
    assert render_detail([{"loc": ["query", "limit"], "msg": "too big"}, "plain"]) == "query.limit: too big; plain"
    assert render_detail({"reason": "Unique constraint violation", "orig_error": "UNIQUE failed"}) == (
        "Unique constraint violation UNIQUE failed")


def test_a_bad_param_or_conf_file_is_refused_before_any_call(stub, tmp_path, capsys):
    assert cli(stub, "trigger", "--param", "novalue") == 2
    assert one_error_line(capsys.readouterr().err) == "--param 'novalue': expected KEY=VALUE"
    (tmp_path / "list.json").write_text("[1]")
    assert cli(stub, "trigger", "--conf-file", str(tmp_path / "list.json")) == 2
    assert one_error_line(capsys.readouterr().err).endswith("list.json: expected a JSON object, got list")
    assert stub.requests == []


# status


def test_status_prints_the_run_and_each_task(stub, capsys):
    stub.on("GET", RUN, run(RUN_ID, "failed", duration=98.4))
    stub.on("GET", f"{RUN}/taskInstances?limit=100",
            tis(("create_vpc", "success", 12.2), ("train", "failed", 61.0), ("delete_vpc", None, None)))

    assert cli(stub, "status", RUN_ID) == 0
    assert capsys.readouterr().out == (
        f"trn1_bert_pretrain run {RUN_ID}: failed in 98 s\n"
        f"  {stub.url}/dags/trn1_bert_pretrain/runs/{RUN_ID}\n"
        "  create_vpc             success           12s\n"
        "  train                  failed            61s\n"
        "  delete_vpc             none                -\n")


def test_status_of_an_unknown_run(stub, capsys):
    assert cli(stub, "status", "nope") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"not found: GET {DAG}/dagRuns/nope (HTTP 404): stub: no route GET {DAG}/dagRuns/nope")


def test_configuration_from_the_environment_and_the_local_passwords_file(stub, monkeypatch, tmp_path, capsys):
    stub.on("GET", RUN, run(RUN_ID, "success"))
    stub.on("GET", f"{RUN}/taskInstances?limit=100", tis())
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"admin": PASSWORD}))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    monkeypatch.setenv("ULTRACLUSTER_AIRFLOW_URL", stub.url)
    assert main(["status", RUN_ID]) == 0  # the password from the file scripts/env.sh names
    monkeypatch.setenv("ULTRACLUSTER_AIRFLOW_PASSWORD", "from-env")
    assert main(["status", RUN_ID]) == 2  # the environment wins over the file
    assert main(["status", "--password", PASSWORD, RUN_ID]) == 0  # options after the subcommand too
    assert [body["password"] for method, path, body in stub.requests if path == "/auth/token"] == [
        PASSWORD, "from-env", PASSWORD]


def fresh_shell(tmp_path: Path, **more: str) -> dict[str, str]:
    """The environment of a new login shell that did not source scripts/env.sh."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
            "LOCAL_ULTRACLUSTER_HOME": str(tmp_path / "no-local-cluster"), **more}


def test_a_fresh_shell_finds_the_passwords_file_env_sh_names(stub, monkeypatch, tmp_path, capsys):
    """Issue 25: `ultracluster status RUN_ID` in a shell that did not source scripts/env.sh failed with
    "no password". The checkout's own env.sh (copied here) says where `make up` keeps the password."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / LOCAL_ENV_SCRIPT, checkout / LOCAL_ENV_SCRIPT)
    (checkout / ".airflow").mkdir()
    (checkout / ".airflow" / "passwords.json").write_text(json.dumps({"admin": PASSWORD}))
    assert passwords_files(fresh_shell(tmp_path), checkout) == [
        checkout / ".airflow" / "passwords.json", tmp_path / "airflow" / GENERATED_PASSWORDS_FILE]

    stub.on("GET", RUN, run(RUN_ID, "success"))
    stub.on("GET", f"{RUN}/taskInstances?limit=100", tis())
    for name in (PASSWORDS_FILE_SETTING, "AIRFLOW_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_ULTRACLUSTER_HOME", str(tmp_path / "no-local-cluster"))
    monkeypatch.setattr(sys.modules["ultracluster.cli.main"], "checkout_root", lambda: checkout)
    assert main(["--url", stub.url, "status", RUN_ID]) == 0
    assert stub.requests[0] == ("POST", "/auth/token", {"username": "admin", "password": PASSWORD})

    (checkout / ".airflow" / "passwords.json").unlink()
    assert main(["--url", stub.url, "status", RUN_ID]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"no password for Airflow user 'admin': pass --password or set ULTRACLUSTER_AIRFLOW_PASSWORD (none in "
        f"{checkout}/.airflow/passwords.json, {Path.home()}/airflow/{GENERATED_PASSWORDS_FILE})")


def test_the_console_script_reads_this_checkouts_env_sh(stub, tmp_path):
    """The installed `ultracluster` runs from this checkout and asks its scripts/env.sh, which honours
    the shell's AIRFLOW_HOME (so this test writes no password into the checkout)."""
    assert checkout_root() == REPO
    home = tmp_path / "airflow-home"
    home.mkdir()
    (home / "passwords.json").write_text(json.dumps({"admin": PASSWORD}))
    stub.on("GET", RUN, run(RUN_ID, "success"))
    stub.on("GET", f"{RUN}/taskInstances?limit=100", tis())
    script = Path(sys.executable).with_name("ultracluster")
    done = subprocess.run([str(script), "--url", stub.url, "status", RUN_ID], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=fresh_shell(tmp_path, AIRFLOW_HOME=str(home)), check=False)
    assert done.returncode == 0, done.stderr
    assert stub.requests[0] == ("POST", "/auth/token", {"username": "admin", "password": PASSWORD})


# report


def test_report_triggers_the_report_dag_and_prints_the_table(stub, capsys):
    report_dag = "/api/v2/dags/trn1_scaling_report"
    report_run = f"{report_dag}/dagRuns/{RUN_ID}"
    table = "| nodes | throughput |\n|---|---|\n| 1 | 10.0 |\n| 2 | 19.5 |\n"
    uri = "s3://ultracluster-artifacts/runs/reports/trn1_bert_pretrain/s1/"
    stub.on("GET", report_dag, (200, {"is_paused": False}))
    stub.on("POST", f"{report_dag}/dagRuns", run(RUN_ID, "queued"))
    stub.on("GET", report_run, run(RUN_ID, "running"), run(RUN_ID, "success"))
    stub.on("GET", f"{report_run}/taskInstances?limit=100", tis(("build_report", "success", 2.0)))
    # An XCom value may come back as a JSON string.
    stub.on("GET", f"{report_run}/taskInstances/build_report/xcomEntries/return_value",
            (200, {"key": "return_value", "value": json.dumps({"markdown": table, "uri": uri})}))

    assert cli(stub, "report", "s1", "--partial") == 0
    assert ("POST", f"{report_dag}/dagRuns", {"logical_date": None, "conf": {"sweep_id": "s1", "partial": True}}) \
        in stub.requests
    out = timeless(capsys.readouterr().out)
    assert out.endswith(f"finished: success in T s\n\n{table}\nreport files: {uri}\n"), out


def test_report_without_a_report_value(stub, capsys):
    report_dag = "/api/v2/dags/trn1_scaling_report"
    stub.on("GET", report_dag, (200, {"is_paused": False}))
    stub.on("POST", f"{report_dag}/dagRuns", run(RUN_ID, "queued"))
    stub.on("GET", f"{report_dag}/dagRuns/{RUN_ID}", run(RUN_ID, "success"))
    stub.on("GET", f"{report_dag}/dagRuns/{RUN_ID}/taskInstances?limit=100", tis())
    assert cli(stub, "report", "s1") == 2
    assert ("POST", f"{report_dag}/dagRuns", {"logical_date": None, "conf": {"sweep_id": "s1", "partial": False}}) \
        in stub.requests
    assert "build_report returned no report" in one_error_line(capsys.readouterr().err)


def test_report_skipped_says_why(stub, capsys):
    report_dag = "/api/v2/dags/trn1_scaling_report"
    stub.on("GET", report_dag, (200, {"is_paused": False}))
    stub.on("POST", f"{report_dag}/dagRuns", run(RUN_ID, "queued"))
    stub.on("GET", f"{report_dag}/dagRuns/{RUN_ID}", run(RUN_ID, "success"))
    stub.on("GET", f"{report_dag}/dagRuns/{RUN_ID}/taskInstances?limit=100", tis(("build_report", "skipped", 0.1)))
    assert cli(stub, "report", "s1") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"trn1_scaling_report run {RUN_ID} skipped build_report: no run of sweep s1 found, or some have not "
        "ended (--partial reports those that have); its log says which")
    assert not any("xcomEntries" in path for _, path, _ in stub.requests)


# the console script


def test_the_console_script(stub):
    script = Path(sys.executable).with_name("ultracluster")
    assert script.exists(), "reinstall the package: bash scripts/setup_venvs.sh"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "trigger" in done.stdout and "sweep" in done.stdout
    done = subprocess.run([str(script), "--url", stub.url, "--password", "wrong", "status", RUN_ID],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("ultracluster: error: Airflow at ") and done.stderr.count("\n") == 1, done.stderr
