"""include/training/node_health.sh, the node health gate's step, against stand-in tools: what it counts,
the line it prints (the schema's nodeHealthReport, and what run.health parses and judges), its exit
code, and the tools' failures. The environment is as bare as a job's (no Neuron or EFA directory on
PATH); the stand-ins are named by UC_HEALTH_NEURON_LS / UC_HEALTH_FI_INFO, as only tests do.
tests/integration/test_health_gate_slurm.py runs it through the product's sbatch on the local cluster."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.training.support import SCHEMA, TRAINING_DIR, TRAINING_PYTHON
from ultracluster.run import health

pytestmark = pytest.mark.training

SCRIPT = TRAINING_DIR / "node_health.sh"
BARE_PATH = "/usr/bin:/bin"


def neuron_ls_json(devices: int) -> str:
    """``neuron-ls --json-output`` as aws-neuronx-tools 2.28 prints it: an indented array, one object
    per Trainium device (values made up in the real shape)."""
    return json.dumps([{"neuron_device": i, "bdf": f"0000:{0x10 + i:02x}:1e.0", "cpu_affinity": "0-127",
                        "numa_node": "0", "connected_to": [(i + 1) % devices, (i - 1) % devices],
                        "nc_count": 2, "memory_size": 34359738368, "neuroncore_ids": [2 * i, 2 * i + 1],
                        "neuron_processes": []} for i in range(devices)], indent=4)


def fi_info_text(devices: int, fabrics: tuple[str, ...] = ("efa", "efa-direct")) -> str:
    """``fi_info -p efa -t FI_EP_RDM``: one entry per fabric and device (libfabric 2.x lists a device
    under both the efa and efa-direct fabrics); a device is its domain."""
    return "".join(f"provider: efa\n    fabric: {fabric}\n    domain: rdmap{16 + i}s27-rdm\n    version: 122.0\n"
                   f"    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n" for i in range(devices) for fabric in fabrics)


def tool(path: Path, stdout: str = "", stderr: str = "", code: int = 0, sleep: float = 0) -> Path:
    """A stand-in program: records its argv, then prints and exits as told."""
    (path.parent / f"{path.name}.out").write_text(stdout)
    (path.parent / f"{path.name}.err").write_text(stderr)
    path.write_text(f"""#!/bin/sh
echo "$@" >> {path}.argv
sleep {sleep}
cat {path}.out; cat {path}.err >&2
exit {code}
""")
    path.chmod(0o755)
    return path


@pytest.fixture
def tools(tmp_path):
    directory = tmp_path / "tools"
    directory.mkdir()
    return directory


def run_gate(tools: Path, instance_type: str = "trn1.32xlarge", neuron: Path | None = None, efa: Path | None = None,
             **extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    expected = health.gate_env(instance_type)
    env = {"PATH": BARE_PATH, "SLURMD_NODENAME": "compute1-st-trn1-3", **expected, **extra}
    if neuron is not None:
        env["UC_HEALTH_NEURON_LS"] = str(neuron)
    if efa is not None:
        env["UC_HEALTH_FI_INFO"] = str(efa)
    done = subprocess.run(["/bin/bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    reports = [json.loads(line[len(health.REPORT_PREFIX):]) for line in done.stdout.splitlines()
               if line.startswith(health.REPORT_PREFIX)]
    return done, reports


def validate_report(report: dict) -> None:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(report, {"$defs": schema["$defs"], "$ref": "#/$defs/nodeHealthReport"})


def verdict(done: subprocess.CompletedProcess, instance_type: str = "trn1.32xlarge") -> health.Verdict:
    (judged,) = health.judge(health.parse_report(done.stdout), instance_type)
    return judged


def test_a_healthy_trn1_32xlarge(tools):
    done, reports = run_gate(tools, neuron=tool(tools / "neuron-ls", neuron_ls_json(16)),
                             efa=tool(tools / "fi_info", fi_info_text(8)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1  # one line per node
    (report,) = reports
    validate_report(report)
    assert report == {"node": "compute1-st-trn1-3", "instance_type": "trn1.32xlarge", "healthy": True,
                      "checks": {"neuron": {"expected": 16, "found": 16}, "efa": {"expected": 8, "found": 8}}}
    assert verdict(done).healthy
    assert (tools / "neuron-ls.argv").read_text() == "--json-output\n"
    assert (tools / "fi_info.argv").read_text() == "-p efa -t FI_EP_RDM\n"


@pytest.mark.parametrize("instance_type, neuron, efa, summary", [
    ("trn1.32xlarge", 15, 8, "neuron (found 15 of 16 devices)"),
    ("trn1.32xlarge", 16, 7, "efa (found 7 of 8 devices)"),
    ("trn1n.32xlarge", 16, 8, "efa (found 8 of 16 devices)"),
    ("trn1n.32xlarge", 16, 16, "healthy"),
])
def test_too_few_devices_fail_the_node(tools, instance_type, neuron, efa, summary):
    done, (report,) = run_gate(tools, instance_type, neuron=tool(tools / "neuron-ls", neuron_ls_json(neuron)),
                               efa=tool(tools / "fi_info", fi_info_text(efa)))
    validate_report(report)
    assert done.returncode == (0 if summary == "healthy" else 1), done.stderr
    assert report["healthy"] is (summary == "healthy")
    assert verdict(done, instance_type).summary == summary


def test_a_failing_neuron_ls_is_reported_with_its_words(tools):
    # What neuron-ls prints on a host whose driver finds no device: nothing on stdout, a logfmt line.
    stderr = 'time="2026-12-01T10:00:00Z" level=fatal msg="Failed to load MLA system information" \\x\n'
    done, (report,) = run_gate(tools, neuron=tool(tools / "neuron-ls", stderr=stderr, code=1),
                               efa=tool(tools / "fi_info", fi_info_text(8)))
    assert done.returncode == 1
    validate_report(report)
    error = report["checks"]["neuron"]["error"]
    assert error == f"{tools}/neuron-ls --json-output exited 1: {stderr.strip()}"
    assert verdict(done).drain_reason.startswith(f"UC health check failed: neuron ({tools}/neuron-ls --json-output "
                                                 "exited 1: time=\"2026-12-01T10:00:00Z\" level=fatal")


def test_no_efa_device_is_a_failed_efa_check(tools):
    # fi_info finds no EFA provider: "fi_getinfo: -61 (No data available)", exit 1.
    done, _ = run_gate(tools, neuron=tool(tools / "neuron-ls", neuron_ls_json(16)),
                       efa=tool(tools / "fi_info", stderr="fi_getinfo: -61 (No data available)\n", code=1))
    assert done.returncode == 1
    assert verdict(done).summary == (f"efa ({tools}/fi_info -p efa -t FI_EP_RDM exited 1: "
                                     "fi_getinfo: -61 (No data available))")


def test_a_hung_tool_times_out(tools):
    done, (report,) = run_gate(tools, neuron=tool(tools / "neuron-ls", neuron_ls_json(16), sleep=30),
                               efa=tool(tools / "fi_info", fi_info_text(8)), UC_HEALTH_TOOL_TIMEOUT_S="1")
    assert done.returncode == 1
    assert report["checks"]["neuron"]["error"] == f"{tools}/neuron-ls --json-output timed out after 1 s"


@pytest.mark.skipif(any(os.path.exists(p) for p in ("/opt/aws/neuron/bin/neuron-ls", "/opt/amazon/efa/bin/fi_info")),
                    reason="this machine has the real tools' paths")
def test_the_tools_are_taken_from_their_real_paths_never_from_path(tools):
    # Stand-ins on PATH are not used: the gate names the production paths, and they are missing here.
    tool(tools / "neuron-ls", neuron_ls_json(16))
    tool(tools / "fi_info", fi_info_text(8))
    done, (report,) = run_gate(tools, PATH=f"{tools}:{BARE_PATH}")
    assert done.returncode == 1
    assert report["checks"]["neuron"]["error"] == "/opt/aws/neuron/bin/neuron-ls not found"
    assert report["checks"]["efa"]["error"] == "/opt/amazon/efa/bin/fi_info not found"
    assert not (tools / "neuron-ls.argv").exists()


def test_trn1_2xlarge_has_no_efa_to_check(tools):
    fi_info = tool(tools / "fi_info", code=1)
    done, (report,) = run_gate(tools, "trn1.2xlarge", neuron=tool(tools / "neuron-ls", neuron_ls_json(1)), efa=fi_info)
    assert done.returncode == 0, done.stderr
    assert report["checks"] == {"neuron": {"expected": 1, "found": 1}, "efa": {"expected": 0, "found": None}}
    assert not (tools / "fi_info.argv").exists() and verdict(done, "trn1.2xlarge").healthy


def test_the_node_is_named_as_slurm_names_it(tools):
    _, (report,) = run_gate(tools, neuron=tool(tools / "neuron-ls", neuron_ls_json(16)),
                            efa=tool(tools / "fi_info", fi_info_text(8)), SLURMD_NODENAME="queue-dy-trn1-12")
    assert report["node"] == "queue-dy-trn1-12"


def test_missing_expectations_are_a_usage_error(tools):
    done = subprocess.run(["/bin/bash", str(SCRIPT)], env={"PATH": BARE_PATH, "SLURMD_NODENAME": "n"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert "UC_HEALTH_NEURON_DEVICES must be an integer >= 0, got ''" in done.stderr


# ------------------------------------------------------------------------------- into results.json
def test_the_training_program_records_the_report(tools, tmp_path):
    if not TRAINING_PYTHON.exists():
        pytest.skip(f"{TRAINING_PYTHON} missing")
    import jsonschema

    lines = []
    for node, devices in (("n-1", 16), ("n-2", 16)):
        done, _ = run_gate(tools, neuron=tool(tools / "neuron-ls", neuron_ls_json(devices)),
                           efa=tool(tools / "fi_info", fi_info_text(8)), SLURMD_NODENAME=node)
        lines.append(done.stdout)
    report = tmp_path / "slurm-5.health"
    report.write_text("UC_HEALTH_NODES n-1 n-2\n" + "".join(lines))
    code = "import json, pretrain_report; print(json.dumps(pretrain_report.node_health()))"

    def read(path: str) -> subprocess.CompletedProcess:
        env = {"PATH": BARE_PATH, **({"NODE_HEALTH_REPORT": path} if path else {})}
        return subprocess.run([str(TRAINING_PYTHON), "-c", code], cwd=TRAINING_DIR, env=env, capture_output=True,
                              text=True, timeout=60)

    done = read(str(report))
    assert done.returncode == 0, done.stderr
    section = json.loads(done.stdout)
    schema = json.loads(SCHEMA.read_text())
    parameters = schema["properties"]["results"]["properties"]["parameters"]["properties"]
    jsonschema.validate(section, {"$defs": schema["$defs"], **parameters["Node health"]})
    assert section["instance_type"] == "trn1.32xlarge" and [n["node"] for n in section["nodes"]] == ["n-1", "n-2"]
    assert json.loads(read("").stdout) is None  # a job without the gate
    missing = read(str(tmp_path / "none.health"))
    assert missing.returncode != 0 and "NODE_HEALTH_REPORT" in missing.stderr and "unreadable" in missing.stderr
