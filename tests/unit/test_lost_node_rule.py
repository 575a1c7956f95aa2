"""The lost-node rule (run.lost_nodes): a loss is one episode per node, counted once whoever sees
it (the fleet wait, a job's end); past ``node_replacements`` the run fails naming the node."""
from __future__ import annotations

import pytest
from ultracluster.parsers.slurm import parse_sinfo
from ultracluster.run.fleet import judge_capacity, partition_capacity
from ultracluster.run.lost_nodes import (
    DEFAULT_NODE_REPLACEMENTS,
    LostNodes,
    replacements,
)
from ultracluster.run.states import FAILED, PENDING, READY

DOWN = "down~: ResumeTimeout reached"


def sinfo(*lines: str) -> list:
    return parse_sinfo("".join(f"compute1*|up|1|{line}\n" for line in lines))


def test_an_episode_counts_once_and_ends_when_the_node_is_seen_healthy():
    lost = LostNodes(limit=1)
    assert lost.observe({"n1": DOWN}, healthy=["n2"]) == ["n1"]
    assert lost.observe({"n1": DOWN}, healthy=["n2"]) == []  # the same episode
    assert lost.fault("7", {"n1": "down*: Not responding"}) == []  # a job's end of that same episode
    assert (lost.counts, lost.past) == ({"n1": 1}, [])
    assert lost.observe({}, healthy=["n1", "n2"]) == [] and lost.failing == []  # replaced
    assert lost.fault("8", {"n1": "down*: Not responding"}) == ["n1"]
    assert lost.fault("8", {"n1": "down*: Not responding"}) == []  # a job counts once
    assert lost.past == ["n1"]
    assert lost.failure() == "Nodes lost past node_replacements=1: n1 (down*: Not responding) lost 2 time(s)"


def test_the_ledger_round_trips_and_a_bad_one_starts_empty():
    lost = LostNodes(limit=2)
    lost.observe({"n1": DOWN}, healthy=[])
    again = LostNodes.from_dict(lost.to_dict(), 2)
    assert again == lost and again.describe() == "n1 1/3"
    assert LostNodes.from_dict({"counts": {"n1": "x"}}, 1) == LostNodes(limit=1)
    assert LostNodes.from_dict(None, 0).limit == 0


@pytest.mark.parametrize("value, number", [(0, 0), ("1", 1), (5, 5)])
def test_replacements_accepts_0_to_5(value, number):
    assert replacements(value) == number


@pytest.mark.parametrize("value", [-1, 6, "x", None, True, "1.5"])
def test_replacements_refuses_anything_else(value):
    with pytest.raises(ValueError, match="node_replacements"):
        replacements(value)


def test_the_default_allows_one_replacement():
    assert DEFAULT_NODE_REPLACEMENTS == 1 == LostNodes().limit


def test_the_fleet_wait_waits_for_a_replacement_then_fails_past_the_limit():
    lost = LostNodes(limit=1)
    failed = sinfo(f"down~|n1|{DOWN.split(': ')[1]}", "idle~|n2|none")
    verdict, reason, message = judge_capacity(partition_capacity(failed, None, 2), lost)
    assert (verdict, reason) == (PENDING, "nodes_replacing") and "n1 1/2" in message, message
    back = sinfo("idle~|n1|ResumeTimeout reached", "idle~|n2|none")  # powered down: a new instance next time
    assert judge_capacity(partition_capacity(back, None, 2), lost).verdict == READY
    verdict, reason, message = judge_capacity(partition_capacity(failed, None, 2), lost)
    assert (verdict, reason) == (FAILED, "node_lost"), message
    assert message.startswith("Nodes lost past node_replacements=1: n1 (down~: ResumeTimeout reached) lost 2 time(s)")


def test_other_nodes_that_can_run_the_job_keep_the_wait_ready():
    lost = LostNodes(limit=0)
    nodes = sinfo("down#|n1|(Code:InsufficientInstanceCapacity)Failure when resuming nodes", "idle~|n2|none")
    assert judge_capacity(partition_capacity(nodes, None, 1), lost).verdict == READY
    assert lost.counts == {"n1": 1}  # counted all the same


def test_a_node_the_task_lost_is_waited_for_whatever_its_reason_says():
    lost = LostNodes(limit=1)
    lost.fault("7", {"n1": "drained: UC health check failed: neuron (found 15 of 16 devices)"})
    drained = sinfo("drained|n1|UC health check failed: neuron (found 15 of 16 devices)", "idle|n2|none")
    verdict, reason, _ = judge_capacity(partition_capacity(drained, None, 2), lost)
    assert (verdict, reason) == (PENDING, "nodes_replacing")
    # Another task's drained node is not this one's to wait for.
    verdict, reason, _ = judge_capacity(partition_capacity(drained, None, 2), LostNodes(limit=1))
    assert (verdict, reason) == (FAILED, "not_enough_nodes")
