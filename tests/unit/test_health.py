"""run.health: what a healthy Trn1 node has, the gate's report lines, each node's verdict and drain
reason; run.jobs' UNHEALTHY outcome; the gate in the sbatch wrap (run as the batch node would, with
a fake srun) and the drain command."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ultracluster import remote_commands as rc
from ultracluster.run import health
from ultracluster.run.events import event
from ultracluster.run.jobs import NODE_FAULT, REFUSED, RETRY, UNHEALTHY, job_outcome


def line(node: str, neuron: int | None = 16, efa: int | None = 8, error: str | None = None, **extra) -> str:
    """A report line as node_health.sh prints it (tests/training/test_node_health.py runs the script)."""
    def check(found, expected):
        return {"expected": expected, "found": found, **({"error": error} if found is None and error else {})}
    report = {"node": node, "instance_type": "trn1.32xlarge", "healthy": True,
              "checks": {"neuron": check(neuron, 16), "efa": check(efa, 8)}, **extra}
    return health.REPORT_PREFIX + json.dumps(report)


# ------------------------------------------------------------------------------- expectations
def test_expected_devices_per_instance_type():
    # Neuron docs: 16 Trainium devices on the 32xlarge sizes, 1 on trn1.2xlarge; 8 EFA devices on
    # trn1.32xlarge, 16 on trn1n.32xlarge, none on the small size.
    assert health.EXPECTATIONS == {
        "trn1.32xlarge": health.Expected(16, 8), "trn1n.32xlarge": health.Expected(16, 16),
        "trn1.2xlarge": health.Expected(1, 0)}


def test_every_instance_type_the_form_offers_has_expectations():
    from ultracluster.run.form import TRN1_INSTANCE_TYPES
    assert sorted(health.EXPECTATIONS) == sorted(TRN1_INSTANCE_TYPES)


@pytest.mark.parametrize("value, expected", [
    ("trn1.32xlarge", "trn1.32xlarge"), (" trn1n.32xlarge ", "trn1n.32xlarge"),
    (None, None), ("", None), ("None", None), ("off", None)])
def test_the_gate_setting(value, expected):
    assert health.gate_instance_type(value) == expected


def test_an_unknown_instance_type_is_refused():
    with pytest.raises(ValueError, match="no expectations for instance type 'p4d.24xlarge'"):
        health.gate_instance_type("p4d.24xlarge")


def test_the_scripts_inputs():
    assert health.gate_env("trn1n.32xlarge") == {"UC_HEALTH_INSTANCE_TYPE": "trn1n.32xlarge",
                                                 "UC_HEALTH_NEURON_DEVICES": "16", "UC_HEALTH_EFA_DEVICES": "16"}


# ------------------------------------------------------------------------------- parse and judge
def test_report_lines_are_found_among_other_output():
    text = "\n".join(["UC_HEALTH_NODES n-1 n-2", "srun: warning", line("n-1"), "0: " + line("n-2"),
                      "UC_HEALTH {not json", "UC_HEALTH {\"checks\": {}}"])
    gate = health.parse_report(text)
    assert gate.nodes == ["n-1", "n-2"]
    assert [r.node for r in gate.reports] == ["n-1", "n-2"]
    assert gate.reports[0].checks == {"neuron": health.CheckResult(16), "efa": health.CheckResult(8)}
    assert gate.unreadable == ["UC_HEALTH {not json", "UC_HEALTH {\"checks\": {}}"]


@pytest.mark.parametrize("report, summary", [
    (line("n"), "healthy"),
    (line("n", neuron=15), "neuron (found 15 of 16 devices)"),
    (line("n", neuron=0, efa=0), "neuron (found 0 of 16 devices)"),  # the first failed check names it
    (line("n", efa=7), "efa (found 7 of 8 devices)"),
    (line("n", neuron=17, efa=9), "healthy"),  # more than the type has is not this node's fault
    (line("n", neuron=None, error="/opt/aws/neuron/bin/neuron-ls --json-output exited 1: no devices"),
     "neuron (/opt/aws/neuron/bin/neuron-ls --json-output exited 1: no devices)"),
    (line("n", efa=None, error="/opt/amazon/efa/bin/fi_info not found"), "efa (/opt/amazon/efa/bin/fi_info not found)"),
])
def test_verdicts(report, summary):
    (verdict,) = health.judge(health.parse_report(report), "trn1.32xlarge")
    assert verdict.summary == summary and verdict.healthy is (summary == "healthy")


def test_the_verdict_comes_from_the_counts_not_the_scripts_word():
    (verdict,) = health.judge(health.parse_report(line("n", neuron=15, healthy=True)), "trn1.32xlarge")
    assert not verdict.healthy


def test_a_check_the_instance_type_lacks_is_not_judged():
    # trn1.2xlarge has no EFA: the script skips fi_info (found null, expected 0).
    report = health.REPORT_PREFIX + json.dumps({"node": "s", "instance_type": "trn1.2xlarge", "healthy": True, "checks": {
        "neuron": {"expected": 1, "found": 1}, "efa": {"expected": 0, "found": None}}})
    (verdict,) = health.judge(health.parse_report(report), "trn1.2xlarge")
    assert verdict.healthy and verdict.found == {"neuron": 1, "efa": None}


def test_a_check_missing_from_a_report_fails_it():
    report = health.REPORT_PREFIX + json.dumps({"node": "n", "checks": {"neuron": {"found": 16}}})
    (verdict,) = health.judge(health.parse_report(report), "trn1.32xlarge")
    assert verdict.summary == "efa (not reported)"


def test_a_silent_node_is_unhealthy_once_another_node_reported():
    gate = health.parse_report("\n".join(["UC_HEALTH_NODES n-1 n-2 n-3", line("n-1"), line("n-3", efa=6)]))
    verdicts = health.judge(gate, "trn1.32xlarge")
    assert [(v.node, v.summary) for v in verdicts] == [
        ("n-1", "healthy"), ("n-3", "efa (found 6 of 8 devices)"),
        ("n-2", "report (the node's gate step printed nothing)")]
    assert health.losses(verdicts) == {
        "n-3": "UC health check failed: efa (found 6 of 8 devices)",
        "n-2": "UC health check failed: report (the node's gate step printed nothing)"}


def test_no_report_at_all_blames_no_node():
    # The gate did not run on the nodes (srun failed, the script is missing): nothing to drain.
    assert health.judge(health.parse_report("UC_HEALTH_NODES n-1 n-2\nsrun: error: ..."), "trn1.32xlarge") == []


def test_drain_reasons_are_one_short_line_grouped_for_scontrol():
    long = health.judge(health.parse_report(line("n", neuron=None, error="x\n" * 300)), "trn1.32xlarge")[0]
    assert len(long.drain_reason) == 200 and "\n" not in long.drain_reason and long.drain_reason.endswith("...")
    lost = {"a": "r1", "b": "r2", "c": "r1"}
    assert health.by_reason(lost) == {"r1": ["a", "c"], "r2": ["b"]}


def test_summary_and_log_lines():
    verdicts = health.judge(health.parse_report("\n".join([line("n-1"), line("n-2", neuron=15)])), "trn1.32xlarge")
    assert health.summary("trn1.32xlarge", verdicts) == {"instance_type": "trn1.32xlarge", "healthy": False, "nodes": {
        "n-1": {"verdict": "healthy", "found": {"neuron": 16, "efa": 8}},
        "n-2": {"verdict": "neuron (found 15 of 16 devices)", "found": {"neuron": 15, "efa": 8}}}}
    assert health.log_lines("trn1.32xlarge", verdicts) == [
        "Node health gate (trn1.32xlarge): 2 node(s), 1 unhealthy",
        "  n-1: healthy [efa=8, neuron=16]", "  n-2: neuron (found 15 of 16 devices) [efa=8, neuron=15]"]


# ------------------------------------------------------------------------------- the outcome
GATE_FAILED = event("job_failed", job_id="9", state="FAILED", exit_code=health.HEALTH_GATE_EXIT_CODE,
                    job_reason="NonZeroExitCode")


@pytest.mark.parametrize("payload, reasons, gated, outcome", [
    (GATE_FAILED, (), True, UNHEALTHY),
    (GATE_FAILED, ("a UC_ERROR printed by the gate's node",), True, UNHEALTHY),
    (GATE_FAILED, (), False, RETRY),  # a job without the gate that happened to exit 75
    ({**GATE_FAILED, "state": "NODE_FAIL"}, (), True, NODE_FAULT),  # a node lost during the gate
    ({**GATE_FAILED, "exit_code": 2}, ("DATA_DIR is empty",), True, REFUSED),
])
def test_job_outcome_unhealthy(payload, reasons, gated, outcome):
    assert job_outcome(payload, reasons, health_gate=gated) == outcome


# ------------------------------------------------------------------------------- remote commands
def test_drain_command():
    command = rc.drain_nodes(["compute1-st-trn1-1", "compute1-dy-trn1-2"],
                             "UC health check failed: neuron (found 15 of 16 devices)")
    assert shlex.split(command.shell) == [
        "sudo", "-n", "--preserve-env=SLURM_CONF", "/opt/slurm/bin/scontrol", "update",
        "NodeName=compute1-st-trn1-1,compute1-dy-trn1-2", "State=DRAIN",
        "Reason=UC health check failed: neuron (found 15 of 16 devices)"]


@pytest.mark.parametrize("nodes, reason", [([], "r"), (["a b"], "r"), (["n;reboot"], "r"), (["-x"], "r"), (["n"], " ")])
def test_drain_refuses_what_is_not_a_node_or_a_reason(nodes, reason):
    with pytest.raises(ValueError):
        rc.drain_nodes(nodes, reason)


def _fake(path: Path, text: str) -> str:
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(0o755)
    return str(path)


def _run_gated_wrap(tmp_path, gate_exit: int, reports: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The train job's wrap, run as the batch node would: fake srun and scontrol stand in for Slurm's;
    the gate step's srun prints ``reports`` and exits ``gate_exit``; the training step's records its env."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    srun = _fake(tmp_path / "srun", f"""if [ "$3" = {job_dir}/node_health.sh ]; then
  printf '%s\\n' {shlex.quote(reports)}; exit {gate_exit}
fi
echo "training $*"; echo "NODE_HEALTH_REPORT=${{NODE_HEALTH_REPORT:-}}" > {tmp_path}/training.env
""")
    scontrol = _fake(tmp_path / "scontrol", 'echo n-1; echo n-2\n')
    command = rc.sbatch(job_dir=str(job_dir), script_path=f"{job_dir}/run.sh", num_nodes=2, job_name="j",
                        comment="c", job_env={}, health_check=f"{job_dir}/node_health.sh")
    words = shlex.split(command.shell)
    wrap = words[words.index("--wrap") + 1]
    wrap = wrap.replace(rc.slurm_command("srun"), srun).replace(rc.slurm_command("scontrol"), scontrol)
    node = subprocess.run(["/bin/sh", "-c", wrap], capture_output=True, text=True, cwd=job_dir,
                          env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n-[1-2]"})
    return node, job_dir


def test_a_failed_gate_ends_the_job_with_its_code_before_training(tmp_path):
    node, job_dir = _run_gated_wrap(tmp_path, 1, "\n".join([line("n-1"), line("n-2", neuron=15)]))
    assert node.returncode == health.HEALTH_GATE_EXIT_CODE, node.stderr
    assert "training" not in node.stdout and not (tmp_path / "training.env").exists()
    assert (job_dir / "slurm-41.exit").read_text().strip() == str(health.HEALTH_GATE_EXIT_CODE)
    report = (job_dir / "slurm-41.health").read_text()
    assert report.splitlines()[0] == "UC_HEALTH_NODES n-1 n-2"
    assert line("n-2", neuron=15) in node.stdout  # the report is in the Slurm log too
    assert f"UC_INFO health gate failed (exit 1): see {job_dir}/slurm-41.health" in node.stdout
    verdicts = health.judge(health.parse_report(report), "trn1.32xlarge")
    assert health.losses(verdicts) == {"n-2": "UC health check failed: neuron (found 15 of 16 devices)"}


def test_a_passed_gate_hands_its_report_to_the_training_step(tmp_path):
    node, job_dir = _run_gated_wrap(tmp_path, 0, "\n".join([line("n-1"), line("n-2")]))
    assert node.returncode == 0, node.stderr
    assert f"training {job_dir}/run.sh" in node.stdout
    assert (tmp_path / "training.env").read_text().strip() == f"NODE_HEALTH_REPORT={job_dir}/slurm-41.health"
    assert (job_dir / "slurm-41.exit").read_text().strip() == "0"


def test_the_gate_runs_once_per_node_and_lets_every_node_report():
    command = rc.sbatch(job_dir="/fsx/j", script_path="/fsx/j/run.sh", num_nodes=2, job_name="j", comment="c",
                        job_env={}, health_check="/fsx/j/node_health.sh")
    words = shlex.split(command.shell)
    wrap = words[words.index("--wrap") + 1]
    assert "/opt/slurm/bin/srun --ntasks-per-node=1 --kill-on-bad-exit=0 /fsx/j/node_health.sh" in wrap
    assert wrap.index("node_health.sh") < wrap.index("/fsx/j/run.sh")
    plain = rc.sbatch(job_dir="/fsx/j", script_path="/fsx/j/run.sh", num_nodes=2, job_name="j", comment="c",
                      job_env={})
    assert "node_health" not in plain.shell and "UC_HEALTH" not in plain.shell
    with pytest.raises(ValueError, match="absolute"):
        rc.sbatch(job_dir="/fsx/j", script_path="/fsx/j/run.sh", num_nodes=2, job_name="j", comment="c",
                  job_env={}, health_check="node_health.sh")


def test_the_gate_script_is_the_cores():
    assert Path(__file__).resolve().parents[2].joinpath("include", "training", health.GATE_SCRIPT).is_file()
    assert os.access(Path(__file__).resolve().parents[2] / "include" / "training" / health.GATE_SCRIPT, os.X_OK)
