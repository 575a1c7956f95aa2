"""Parsers against REAL Slurm 22.05.8 output captured in tests/fixtures/slurm (see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ultracluster.parsers import slurm as parse
from ultracluster.run import fleet, states

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_fixtures_are_from_slurm_22_05_8():
    assert fixture("sinfo_version.out").strip() == "slurm-wlm 22.05.8"


@pytest.mark.parametrize(
    "name, state, exit_code, signal, reason",
    [
        ("scontrol_running.out", "RUNNING", 0, 0, None),
        ("scontrol_running_oneliner.out", "RUNNING", 0, 0, None),
        ("scontrol_pending.out", "PENDING", 0, 0, "Resources"),
        ("scontrol_configuring.out", "CONFIGURING", 0, 0, None),
        ("scontrol_completed.out", "COMPLETED", 0, 0, None),
        ("scontrol_failed.out", "FAILED", 3, 0, "NonZeroExitCode"),
        ("scontrol_cancelled.out", "CANCELLED", 0, 15, None),
        ("scontrol_timeout.out", "TIMEOUT", 0, 15, "TimeLimit"),
        ("scontrol_node_fail.out", "NODE_FAIL", 0, 0, "NodeDown"),
        ("scontrol_dynamic_failed.out", "NODE_FAIL", 0, 0, "NodeDown"),
    ],
)
def test_scontrol_show_job(name, state, exit_code, signal, reason):
    info = parse.parse_scontrol_show_job(fixture(name))
    assert (info.state, info.exit_code, info.signal, info.reason) == (state, exit_code, signal, reason)
    assert info.job_id.isdigit()
    assert info.stdout_path and info.stdout_path.endswith(f"slurm-{info.job_id}.out")
    assert info.terminal == (state in states.JOB_TERMINAL_STATES)


def test_scontrol_comment_and_multiline_equal_oneliner():
    multi = parse.parse_scontrol_show_job(fixture("scontrol_running.out"))
    one = parse.parse_scontrol_show_job(fixture("scontrol_running_oneliner.out"))
    assert multi.comment == one.comment == "run_id=manual__2026-11-30"
    assert multi.name == one.name == "uc-mix"
    assert multi.raw["AllocNode:Sid"] == one.raw["AllocNode:Sid"]
    assert multi.num_nodes == 1


def test_scontrol_comment_with_spaces_keeps_lowercase_words():
    # The operator's --comment is "ultracluster run_id=<id>": run_id= must stay inside the value.
    text = fixture("scontrol_running.out").replace("Comment=run_id=", "Comment=ultracluster run_id=")
    info = parse.parse_scontrol_show_job(text)
    assert info.comment == "ultracluster run_id=manual__2026-11-30"
    assert "run_id" not in info.raw and info.raw["StdErr"].endswith("slurm-1.out")


def test_scontrol_rejects_other_text():
    with pytest.raises(parse.SlurmParseError):
        parse.parse_scontrol_show_job(fixture("scontrol_unknown_job.out") + fixture("scontrol_unknown_job.err"))
    assert parse.is_unknown_job_error(fixture("scontrol_unknown_job.err"))


def test_sbatch_outputs():
    assert parse.parse_sbatch(fixture("sbatch_mix.out")) == "1"  # --parsable
    assert parse.parse_sbatch(fixture("sbatch_alloc.out")) == "2"  # "Submitted batch job 2"
    assert parse.parse_sbatch("123;cluster\n") == "123"
    with pytest.raises(parse.SlurmParseError):
        parse.parse_sbatch(fixture("sbatch_bad_partition.out") + fixture("sbatch_bad_partition.err"))


def test_squeue_states_and_comment():
    jobs = {j.job_id: j for j in parse.parse_squeue(fixture("squeue_mixed.out"))}
    assert jobs["3"].state == "PENDING" and jobs["3"].reason == "Resources" and jobs["3"].nodes == ""
    assert jobs["1"].state == "RUNNING" and jobs["1"].comment == "run_id=manual__2026-11-30"
    assert jobs["2"].comment is None
    everything = {j.job_id: j.state for j in parse.parse_squeue(fixture("squeue_all_states.out"))}
    assert set(everything.values()) >= {"CANCELLED", "COMPLETED", "NODE_FAIL", "FAILED", "TIMEOUT"}
    assert parse.parse_squeue(fixture("squeue_none.out")) == []
    configuring = parse.parse_squeue(fixture("squeue_configuring.out"))
    assert "CONFIGURING" in {j.state for j in configuring}
    assert all(states.job_is_active(j.state) for j in configuring)


def test_sinfo_node_states():
    nodes = {n.name: n for n in parse.parse_sinfo(fixture("sinfo_down_drained.out"))}
    assert nodes["compute1-dy-trn1-2"].is_idle_powered_down
    assert nodes["compute1-dy-trn1-1"].is_unusable and nodes["compute1-dy-trn1-1"].reason == "ResumeTimeout reached"
    assert nodes["compute1-st-trn1-1"].is_unusable and nodes["compute1-st-trn1-1"].not_responding
    assert nodes["compute1-st-trn1-2"].is_unusable and nodes["compute1-st-trn1-2"].reason == "Kernel panic on boot"
    assert nodes["compute2-st-trn1-1"].is_idle_ready
    assert nodes["compute1-st-trn1-1"].default_partition and not nodes["compute2-st-trn1-1"].default_partition


def test_capacity_idle_and_idle_tilde_count():
    nodes = parse.parse_sinfo(fixture("sinfo_idle.out"))
    capacity = fleet.partition_capacity(nodes, None, 4)
    assert capacity.partition == "compute1"
    assert sorted(capacity.idle) == ["compute1-st-trn1-1", "compute1-st-trn1-2"]
    assert sorted(capacity.powered_down) == ["compute1-dy-trn1-1", "compute1-dy-trn1-2"]
    assert capacity.ready
    assert not fleet.partition_capacity(nodes, None, 5).ready
    assert fleet.partition_capacity(nodes, None, 5).impossible
    assert fleet.partition_capacity(nodes, "compute2", 1).ready


def test_capacity_busy_nodes_mean_wait_not_fail():
    nodes = parse.parse_sinfo(fixture("sinfo_mix_alloc.out"))
    capacity = fleet.partition_capacity(nodes, "compute1", 3)
    assert sorted(capacity.busy) == ["compute1-st-trn1-1", "compute1-st-trn1-2"]
    assert not capacity.ready and not capacity.impossible


def test_capacity_down_drained_is_impossible_with_reasons():
    nodes = parse.parse_sinfo(fixture("sinfo_down_drained.out"))
    capacity = fleet.partition_capacity(nodes, "compute1", 2)
    assert capacity.impossible and not capacity.ready
    text = capacity.describe()
    assert "Kernel panic on boot" in text and "Not responding" in text and "ResumeTimeout reached" in text
    assert fleet.partition_capacity(nodes, "compute1", 1).ready


def test_powering_up_node_is_busy():
    nodes = {n.name: n for n in parse.parse_sinfo(fixture("sinfo_powering_up.out"))}
    assert nodes["compute1-dy-trn1-1"].state == "mixed#"
    assert not nodes["compute1-dy-trn1-1"].is_unusable and not nodes["compute1-dy-trn1-1"].is_idle_ready


def test_unknown_partition():
    with pytest.raises(fleet.PartitionNotFound, match="not found"):
        fleet.partition_capacity(parse.parse_sinfo(fixture("sinfo_idle.out")), "gpu", 1)


def test_sacct_without_slurmdbd():
    assert parse.is_accounting_disabled(fixture("sacct_no_dbd.err"))
    # With slurmdbd (local UltraCluster, Database set): a job that exited 3.
    assert parse.parse_sacct(fixture("sacct_failed.out"), "1") [:3] == ("FAILED", 3, 0)
    assert parse.parse_sacct(fixture("sacct_failed.out"), "2") is None


def test_state_tables():
    for state in ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED"):
        assert state in states.JOB_FAILURE_STATES and state in states.JOB_TERMINAL_STATES
    assert states.base_state("CANCELLED by 0") == "CANCELLED"
    assert states.job_is_active("PENDING") and states.job_is_active("COMPLETING") and not states.job_is_active("COMPLETED")


def test_exit_marker():
    assert parse.parse_exit_marker("0\n") == 0 and parse.parse_exit_marker("137") == 137
    assert parse.parse_exit_marker("") is None and parse.parse_exit_marker("garbage") is None


def test_file_listing_and_log_chunk():
    import base64

    from ultracluster.parsers.files import FileOutputError, parse_file_listing, parse_log_chunk

    assert parse_file_listing("12 results.json\n3 ckpt/a b.pt\n\nnoise\n") == {"results.json": 12, "ckpt/a b.pt": 3}
    chunk = parse_log_chunk(f"42\n{base64.b64encode(b'UC_PROGRESS step=1').decode()}\n")
    assert (chunk.size, chunk.data) == (42, b"UC_PROGRESS step=1")
    assert parse_log_chunk("-1\n").size == -1
    with pytest.raises(FileOutputError):
        parse_log_chunk("not a size\n")
    with pytest.raises(FileOutputError):
        parse_log_chunk("5\n###\n")
