"""wait_for_fleet: cluster gate (describe-cluster), Slurm gate (REAL sinfo output), fail-fast
reasons, first-contact host key, and the sensor's defer/complete path."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib
import json
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

import ultracluster.sensors.fleet as fleet_sensor_module
import ultracluster.triggers.fleet as fleet_trigger_module
from tests.unit.triggerer import in_triggerer
from ultracluster.hooks.head_node import CommandResult, HeadNodeHook, HeadNodeUnreachableError
from ultracluster.hooks.slurm import SlurmHook
from ultracluster.parsers.pcluster import ClusterNotFoundError, cluster_facts, cluster_identity, public_description
from ultracluster.run.events import event
from ultracluster.run.fleet import judge_cluster
from ultracluster.run.lost_nodes import LostNodes
from ultracluster.run.returns import cluster_created
from ultracluster.run.states import FAILED, PENDING, READY
from ultracluster.sensors.fleet import STATE_KEY_HOST_KEY, ComputeFleetSensor, FleetCheck
from ultracluster.triggers.fleet import ComputeFleetTrigger

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinnedAtFirstContact"


def described(name: str) -> dict:
    return json.loads((ROOT / "pcluster" / f"describe_cluster_{name}.json").read_text())


def sinfo(name: str) -> CommandResult:
    return CommandResult(0, (ROOT / "slurm" / f"{name}.out").read_text(), "")


class FakePcluster:
    """The trigger's async describe-cluster."""

    def __init__(self, *descriptions):
        self.descriptions = list(descriptions)

    async def adescribe_cluster(self, cluster_name):
        item = self.descriptions.pop(0) if len(self.descriptions) > 1 else self.descriptions[0]
        if isinstance(item, Exception):
            raise item
        return item


class SinfoHeadNode:
    def __init__(self, *results):
        self.results = list(results)
        self.commands = []
        self.connections = 0
        self.conns = []

    @contextlib.asynccontextmanager
    async def aconnection(self):
        self.connections += 1
        yield f"conn-{self.connections}"

    async def arun(self, command, *, conn=None, timeout=None):
        self.commands.append(command)
        self.conns.append(conn)
        item = self.results.pop(0) if len(self.results) > 1 else self.results[0]
        if isinstance(item, Exception):
            raise item
        return item


class FakeDescribe:
    """ParallelClusterHook's describe_cluster, answering from a list (the last answer repeats)."""

    def __init__(self, *descriptions):
        self.descriptions = list(descriptions)

    def describe_cluster(self, cluster_name):
        item = self.descriptions.pop(0) if len(self.descriptions) > 1 else self.descriptions[0]
        if isinstance(item, Exception):
            raise item
        return item


@pytest.fixture
def head_nodes(monkeypatch):
    """The worker-side wait's head node (sensors.fleet.HeadNodeHook): sinfo answers and first contact."""

    class FakeHeadNodeHook:
        results: list = []
        seen: list = []  # the head node dict of each connection
        fetched: list = []  # first contacts
        refuse = False

        def __init__(self, ssh_conn_id, head_node):
            FakeHeadNodeHook.seen.append(head_node)

        def run(self, command, timeout=None):
            results = FakeHeadNodeHook.results
            item = results.pop(0) if len(results) > 1 else results[0]
            if isinstance(item, Exception):
                raise item
            return item

        def close(self):
            pass

        @staticmethod
        def fetch_host_key(address, port, timeout=10):
            if FakeHeadNodeHook.refuse:
                raise ConnectionRefusedError("refused")
            FakeHeadNodeHook.fetched.append((address, port))
            return HOST_KEY

    monkeypatch.setattr(fleet_sensor_module, "HeadNodeHook", FakeHeadNodeHook)
    return FakeHeadNodeHook


def check(head_nodes, sinfo_result, *descriptions, **kwargs):
    """One round of both gates in the worker (FleetCheck): (judgement, head node or None)."""
    head_nodes.results = [sinfo_result]
    params = dict(cluster_name="uc-run1", num_nodes=2, partition=None, ssh_conn_id="ultracluster_head_node",
                  ssh_port=2222)
    params.update(kwargs)
    fleet_check = FleetCheck(pcluster_hook=FakeDescribe(*descriptions), **params)
    judgement, head = fleet_check.check()
    return judgement.verdict, judgement.message, head, fleet_check


def judged(description: dict):
    return judge_cluster(**cluster_facts(description))


@pytest.fixture
def first_contact(monkeypatch):
    """The trigger's first contact (asyncssh), recorded."""
    calls = []

    async def fetch(address, port, timeout=10):
        calls.append((address, port))
        return HOST_KEY

    monkeypatch.setattr(HeadNodeHook, "afetch_host_key", staticmethod(fetch))
    return calls


def make_trigger(head_node: SinfoHeadNode, **kwargs) -> ComputeFleetTrigger:
    params = dict(cluster_name="uc-run1", num_nodes=2, partition=None, pcluster_conn_id="pcluster_default",
                  ssh_conn_id="ultracluster_head_node", ssh_port=2222, poke_interval=0)
    params.update(kwargs)
    trigger = ComputeFleetTrigger(**params)
    trigger._slurm = lambda head: (setattr(trigger, "_seen_head", head), SlurmHook(head_node_hook=head_node))[1]
    return trigger


# ---------------------------------------------------------------------------- cluster gate


def test_cluster_gate_states():
    assert judged(described("create_complete")).verdict == READY
    assert judged(described("create_in_progress")).verdict == PENDING
    failed = judged(described("create_failed"))
    assert failed.verdict == FAILED and failed.reason == "cluster_failed"
    assert "CREATE_FAILED" in failed.message and "OnNodeConfiguredExecutionFailure" in failed.message
    assert judged(described("delete_in_progress"))[:2] == (FAILED, "cluster_gone")
    assert judged(described("delete_failed"))[:2] == (FAILED, "cluster_failed")


@pytest.mark.parametrize("fleet, verdict", [("PROTECTED", FAILED), ("STOPPED", FAILED), ("STARTING", PENDING),
                                            ("START_REQUESTED", PENDING), ("RUNNING", READY)])
def test_compute_fleet_status(fleet, verdict):
    description = copy.deepcopy(described("create_complete"))
    description["computeFleetStatus"] = fleet
    judgement = judged(description)
    assert judgement.verdict == verdict
    if fleet == "PROTECTED":
        assert "PROTECTED" in judgement.message and "bootstrap" in judgement.message


# ------------------------------------------------------------------------------ both gates


def test_ready_on_idle_nodes_returns_pinned_head_node(head_nodes):
    verdict, reason, result, _ = check(head_nodes, sinfo("sinfo_idle"), described("create_complete"), num_nodes=4)
    assert verdict == READY, reason
    assert result == {"cluster_name": "uc-run1", "address": "198.51.100.44", "host_key": HOST_KEY, "partition": "compute1"}
    assert head_nodes.fetched == [("198.51.100.44", 2222)]
    assert head_nodes.seen[-1]["host_key"] == HOST_KEY  # the Slurm check already used the pinned key


def test_ready_counts_powered_down_dynamic_nodes(head_nodes):
    # both static nodes busy, 2 dynamic nodes idle~: a 2-node job can start (Slurm powers them up)
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_mix_alloc"), described("create_complete"), num_nodes=2)
    assert verdict == READY and "idle~ (powered down) 2" in reason


def test_waits_while_nodes_are_busy(head_nodes):
    verdict, _, result, _ = check(head_nodes, sinfo("sinfo_mix_alloc"), described("create_complete"), num_nodes=3)
    assert verdict == PENDING and result is None


def test_fails_fast_when_needed_nodes_are_down_or_drained(head_nodes):
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_down_drained"), described("create_complete"), num_nodes=2,
                                  lost=LostNodes(limit=0))
    assert verdict == FAILED
    assert "Kernel panic on boot" in reason and "Not responding" in reason and "ResumeTimeout reached" in reason
    # With a replacement left, the node past ResumeTimeout is waited for: it and the idle~ one make 2.
    verdict, reason, _, fleet_check = check(head_nodes, sinfo("sinfo_down_drained"), described("create_complete"),
                                            num_nodes=2)
    assert verdict == PENDING and "replace lost node(s) (losses/allowed: compute1-dy-trn1-1 1/2)" in reason, reason
    assert fleet_check.lost.reasons == {"compute1-dy-trn1-1": "down~: ResumeTimeout reached"}
    # Three nodes cannot be had even once it is replaced: the drained and the unresponsive one stay out.
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_down_drained"), described("create_complete"), num_nodes=3)
    assert verdict == FAILED and reason.startswith("Not enough usable nodes"), reason


def test_named_queue_and_unknown_queue(head_nodes):
    verdict, _, head, _ = check(head_nodes, sinfo("sinfo_down_drained"), described("create_complete"), num_nodes=1,
                                partition="compute2")
    assert verdict == READY and head["partition"] == "compute2"
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_idle"), described("create_complete"), partition="nope")
    assert verdict == FAILED and "nope" in reason


def test_waits_for_sshd_and_slurm(head_nodes):
    head_nodes.refuse = True
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_idle"), described("create_complete"))
    assert verdict == PENDING and "sshd" in reason
    head_nodes.refuse = False
    identity = cluster_identity(described("create_complete"))
    pin = {"host_key": HOST_KEY, "cluster": identity}
    assert check(head_nodes, HeadNodeUnreachableError("reset"), described("create_complete"), pin=pin)[0] == PENDING
    not_up = CommandResult(1, "", "slurm_load_partitions: Unable to contact slurm controller (connect failure)")
    assert check(head_nodes, not_up, described("create_complete"), pin=pin)[0] == PENDING


def test_missing_cluster_fails(head_nodes):
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_idle"), ClusterNotFoundError("Cluster 'uc-run1' does not exist"))
    assert verdict == FAILED and "does not exist" in reason


def test_known_host_key_is_not_fetched_again(head_nodes):
    pin = {"host_key": HOST_KEY, "cluster": cluster_identity(described("create_complete"))}
    assert check(head_nodes, sinfo("sinfo_idle"), described("create_complete"), pin=pin)[0] == READY
    assert head_nodes.fetched == []


def recreated(description: dict) -> dict:
    """The same cluster name built again (a cleared setup in the same run): new stack, new head node."""
    again = copy.deepcopy(description)
    again["cloudformationStackArn"] = again["cloudformationStackArn"].replace("1234abcd", "99990000")
    again["creationTime"] = "2026-11-30T09:30:00.000Z"
    again["headNode"]["instanceId"] = "i-0fedcba0987654321"
    return again


def test_key_pinned_for_an_earlier_cluster_of_the_name_is_not_reused(head_nodes):
    old = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKeyOfTheDeletedCluster"
    pin = {"host_key": old, "cluster": cluster_identity(described("create_complete"))}
    verdict, reason, head, fleet_check = check(head_nodes, sinfo("sinfo_idle"), recreated(described("create_complete")),
                                               num_nodes=1, pin=pin)
    assert verdict == READY, reason
    assert head_nodes.fetched == [("198.51.100.44", 2222)]
    assert head["host_key"] == HOST_KEY and head_nodes.seen[-1]["host_key"] == HOST_KEY
    assert fleet_check.pin == {"host_key": HOST_KEY, "cluster": cluster_identity(recreated(described("create_complete")))}


def test_kept_host_key_is_never_replaced_by_first_contact(head_nodes):
    """train's auto-resume keeps wait_for_fleet's key: it is used without a cluster identity to match."""
    verdict, reason, head, _ = check(head_nodes, sinfo("sinfo_idle"), recreated(described("create_complete")),
                                     pin={"host_key": HOST_KEY}, keep_host_key=True)
    assert verdict == READY, reason
    assert head_nodes.fetched == [] and head["host_key"] == HOST_KEY
    with pytest.raises(ValueError, match="pinned host_key"):
        check(head_nodes, sinfo("sinfo_idle"), described("create_complete"), keep_host_key=True)
    trigger = make_trigger(SinfoHeadNode(sinfo("sinfo_idle")), host_key=HOST_KEY, keep_host_key=True)
    assert trigger.serialize()[1]["keep_host_key"] is True


def test_trigger_run_waits_then_fires(first_contact):
    head_node = SinfoHeadNode(sinfo("sinfo_idle"))
    trigger = make_trigger(head_node, region_name="eu-west-1")
    pcluster = FakePcluster(described("create_in_progress"), described("create_in_progress"), described("create_complete"))
    hook_kwargs = []

    async def first():
        original = fleet_trigger_module.ParallelClusterHook
        fleet_trigger_module.ParallelClusterHook = lambda **kwargs: (hook_kwargs.append(kwargs), pcluster)[1]
        try:
            async for event in trigger.run():
                return event.payload
        finally:
            fleet_trigger_module.ParallelClusterHook = original

    event = asyncio.run(first())
    assert event["status"] == "success" and event["head_node"]["host_key"] == HOST_KEY
    assert event["host_key_cluster"] == cluster_identity(described("create_complete"))
    assert hook_kwargs == [{"pcluster_conn_id": "pcluster_default", "region_name": "eu-west-1"}]
    # Ready at the first sinfo: on the one connection the trigger opened for the Slurm gate.
    assert head_node.connections == 1 and head_node.conns == ["conn-1"]


def run_to_end(trigger, pcluster, monkeypatch):
    """The trigger's one event, with describe-cluster answered by ``pcluster`` and a fixed clock."""
    monkeypatch.setattr(fleet_trigger_module, "ParallelClusterHook", lambda **_: pcluster)
    monkeypatch.setattr(fleet_trigger_module, "utc_now", lambda: "2026-12-03T10:00:00+00:00")

    async def first():
        async for fired in trigger.run():
            return fired

    return asyncio.run(first())


def test_a_fleet_seen_ready_ends_the_task_in_the_triggerer_with_the_worker_paths_value(first_contact, monkeypatch, pushed):
    from airflow.triggers.base import TaskSuccessEvent

    identity = cluster_identity(described("create_complete"))
    pinned = dict(host_key=HOST_KEY, host_key_cluster=identity)  # what the task state store holds already
    ended = run_to_end(in_triggerer(make_trigger(SinfoHeadNode(sinfo("sinfo_idle")), **pinned, end_task=True)),
                       FakePcluster(described("create_complete")), monkeypatch)
    assert isinstance(ended, TaskSuccessEvent) and first_contact == []
    # The worker path, given the plain event of the same wait, returns the same XCom.
    # dag.test() runs the trigger without a task instance: the same wait resumes the task there.
    plain = run_to_end(make_trigger(SinfoHeadNode(sinfo("sinfo_idle")), **pinned, end_task=True),
                       FakePcluster(described("create_complete")), monkeypatch)
    sensor = ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2)
    assert pushed == {"return_value": sensor.execute_complete(ctx(DictStore()), plain.payload)}
    assert pushed["return_value"]["ready_at"] == "2026-12-03T10:00:00+00:00"


def test_a_fleet_wait_with_something_new_to_store_resumes_the_worker(first_contact, monkeypatch, pushed):
    """A first contact made in the trigger (or a ledger that changed) must reach the task state store,
    where a cleared task finds its pin: the worker stores it."""
    ended = run_to_end(in_triggerer(make_trigger(SinfoHeadNode(sinfo("sinfo_idle")), end_task=True)),
                       FakePcluster(described("create_complete")), monkeypatch)
    assert type(ended).__name__ == "TriggerEvent" and ended.payload["status"] == "success"
    assert ended.payload["host_key"] == HOST_KEY and first_contact == [("198.51.100.44", 2222)] and pushed == {}
    store = DictStore()
    ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2).execute_complete(
        ctx(store), ended.payload)
    assert store[STATE_KEY_HOST_KEY]["host_key"] == HOST_KEY


def test_a_failing_describe_cluster_backs_off_and_a_success_resets_the_rate(first_contact, monkeypatch):
    from ultracluster.parsers.pcluster import PclusterError

    throttled = PclusterError("An error occurred (Throttling) when calling the DescribeStacks operation: Rate exceeded")
    pcluster = FakePcluster(throttled, throttled, throttled, throttled, described("create_in_progress"),
                            described("create_complete"))
    sleeps = []

    async def sleep(seconds):
        sleeps.append(seconds)

    monkeypatch.setattr(fleet_trigger_module, "asyncio", SimpleNamespace(sleep=sleep))
    monkeypatch.setattr(fleet_trigger_module, "ParallelClusterHook", lambda **_: pcluster)
    trigger = make_trigger(SinfoHeadNode(sinfo("sinfo_idle")), poke_interval=10)

    async def first():
        async for event in trigger.run():
            return event.payload

    assert asyncio.run(first())["status"] == "success"
    # Jittered doubling from the poke interval: [10, 20], [20, 40], [40, 80], [80, 160]; then the rate again.
    assert len(sleeps) == 5 and all(10 <= s for s in sleeps), sleeps
    assert sleeps[0] <= 20 < 40 <= sleeps[2] and sleeps[3] >= 80 and sleeps[4] == 10, sleeps


def test_trigger_serialize_round_trip():
    trigger = ComputeFleetTrigger(cluster_name="c", num_nodes=2, partition="compute1", pcluster_conn_id="p",
                                  ssh_conn_id="s", ssh_port=2222, host_key=HOST_KEY, host_key_cluster="arn|t|i",
                                  poke_interval=5, region_name="eu-west-1", wait_window_s=120)
    classpath, kwargs = trigger.serialize()
    assert kwargs["region_name"] == "eu-west-1" and kwargs["host_key_cluster"] == "arn|t|i"
    assert kwargs["wait_window_s"] == 120
    module, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert cls(**kwargs).serialize() == (classpath, kwargs)
    json.dumps(kwargs)


# ---------------------------------------------------------------------------------- sensor


class DictStore(dict):
    def set(self, key, value, **_):
        self[key] = value


def ctx(store, try_number: int = 1):
    return {"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="wait_for_fleet", map_index=-1, try_number=try_number),
            "task_state_store": store}


@pytest.fixture
def ssh_conn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE", json.dumps({"conn_type": "ssh", "login": "ultracluster", "port": 2222}))


@pytest.fixture
def describe_as(monkeypatch):
    """The sensor's worker-side describe-cluster (sensors.fleet.ParallelClusterHook)."""
    def answer(*descriptions):
        monkeypatch.setattr(fleet_sensor_module, "ParallelClusterHook", lambda *_a, **_k: FakeDescribe(*descriptions))
    return answer


def test_sensor_defers_with_stored_host_key(ssh_conn, describe_as):
    describe_as(described("create_in_progress"))  # the worker's first look: not up yet
    sensor = ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2, timeout=600,
                                region_name="eu-west-1")
    assert "region_name" in sensor.template_fields
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(ctx(DictStore({STATE_KEY_HOST_KEY: {"host_key": HOST_KEY, "cluster": "arn|t|i"}})))
    trigger = deferred.value.trigger
    assert trigger.host_key == HOST_KEY and trigger.host_key_cluster == "arn|t|i"
    assert trigger.ssh_port == 2222 and trigger.num_nodes == 2 and trigger.region_name == "eu-west-1"
    assert trigger.end_task is True  # a fleet seen ready there ends the task in the triggerer
    assert deferred.value.timeout.total_seconds() == 600


def test_sensor_drops_a_stored_key_without_cluster_identity(ssh_conn, describe_as):
    describe_as(described("create_in_progress"))
    sensor = ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(ctx(DictStore({STATE_KEY_HOST_KEY: HOST_KEY})))
    assert deferred.value.trigger.host_key is None and deferred.value.trigger.region_name is None


def test_a_fleet_ready_at_the_first_look_needs_no_deferral(ssh_conn, describe_as, head_nodes):
    describe_as(described("create_complete"))
    head_nodes.results = [sinfo("sinfo_idle")]
    store = DictStore()
    sensor = ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2)
    result = sensor.execute(ctx(store))
    assert datetime.fromisoformat(result.pop("ready_at")).tzinfo is not None
    assert result == {"cluster_name": "uc-run1", "address": "198.51.100.44", "host_key": HOST_KEY,
                      "partition": "compute1"}
    assert store[STATE_KEY_HOST_KEY] == {"host_key": HOST_KEY, "cluster": cluster_identity(described("create_complete"))}


def test_a_first_contact_in_the_worker_is_stored_before_the_deferral(ssh_conn, describe_as, head_nodes):
    describe_as(described("create_complete"))
    head_nodes.results = [sinfo("sinfo_mix_alloc")]  # up, but 3 nodes are not free yet: the trigger waits
    store = DictStore()
    with pytest.raises(TaskDeferred) as deferred:
        ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=3).execute(ctx(store))
    pin = {"host_key": HOST_KEY, "cluster": cluster_identity(described("create_complete"))}
    assert store[STATE_KEY_HOST_KEY] == pin
    trigger = deferred.value.trigger
    assert (trigger.host_key, trigger.host_key_cluster) == (pin["host_key"], pin["cluster"])


class CountingDescribe(FakeDescribe):
    calls = 0

    def describe_cluster(self, cluster_name):
        CountingDescribe.calls += 1
        return super().describe_cluster(cluster_name)


@pytest.mark.parametrize("try_number, existing, describes", [(1, False, 0), (2, False, 1), (1, True, 1)])
def test_a_first_try_judges_the_cluster_gate_on_pcluster_creates_answer(ssh_conn, monkeypatch, head_nodes,
                                                                      try_number, existing, describes):
    # pcluster_create described the cluster moments before: a first try does not describe it again. A
    # retry may come hours later, and an adopted cluster's value has no creation time for the pin.
    live = described("create_complete")
    created = {**cluster_created("uc-run1", public_description(live), None), **({"existing": True} if existing else {})}
    CountingDescribe.calls = 0
    monkeypatch.setattr(fleet_sensor_module, "ParallelClusterHook", lambda *_a, **_k: CountingDescribe(live))
    head_nodes.results = [sinfo("sinfo_idle")]
    store = DictStore()
    sensor = ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2, cluster=created)
    assert "cluster" in sensor.template_fields
    result = sensor.execute(ctx(store, try_number))
    assert (result["address"], result["host_key"]) == ("198.51.100.44", HOST_KEY)
    assert CountingDescribe.calls == describes
    # The pin names the cluster as the trigger's and later tries' describe-cluster will.
    assert store[STATE_KEY_HOST_KEY] == {"host_key": HOST_KEY, "cluster": cluster_identity(live)}


def test_a_cluster_value_not_ready_is_looked_at_again_by_the_trigger(ssh_conn, describe_as, head_nodes):
    describe_as(described("create_complete"))
    created = cluster_created("uc-run1", {**described("create_complete"), "computeFleetStatus": "STARTING"}, None)
    with pytest.raises(TaskDeferred) as deferred:
        ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2,
                           cluster=created).execute(ctx(DictStore()))
    assert deferred.value.trigger.end_task is True


def test_sensor_complete_returns_head_node_and_keeps_key():
    sensor = ComputeFleetSensor(task_id="wait_for_fleet", cluster_name="uc-run1", num_nodes=2)
    store = DictStore()
    head = {"cluster_name": "uc-run1", "address": "127.100.1.1", "host_key": HOST_KEY, "partition": "compute1"}
    ready = event("complete", "ok", head_node=head, ready_at="2026-12-03T10:00:00+00:00", host_key=HOST_KEY,
                  host_key_cluster="arn|t|i")
    result = sensor.execute_complete(ctx(store), ready)
    assert result == {**head, "ready_at": "2026-12-03T10:00:00+00:00"}  # when the trigger saw it: idle time starts
    assert store[STATE_KEY_HOST_KEY] == {"host_key": HOST_KEY, "cluster": "arn|t|i"}
    with pytest.raises(AirflowException, match="PROTECTED"):
        sensor.execute_complete(ctx(store), event("fleet_protected", "Compute fleet of x is PROTECTED"))


@pytest.mark.parametrize("num_nodes", [0, "x", -1])
def test_sensor_rejects_bad_num_nodes(num_nodes):
    with pytest.raises(ValueError, match="num_nodes"):
        ComputeFleetSensor(task_id="w", cluster_name="c", num_nodes=num_nodes).execute(ctx(DictStore()))


# ------------------------------------------------------------- nodes that never come up


def test_fails_early_when_nodes_fail_to_power_up(head_nodes):
    # Real Slurm on the local UltraCluster with insufficient capacity: both dynamic nodes down# with pcluster's reason.
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_power_up_failed"), described("create_complete"),
                                  lost=LostNodes(limit=0))
    assert verdict == FAILED
    assert reason.startswith("Nodes lost past node_replacements=0: compute1-dy-trn1-1 (down#: (Code:Insufficient"
                             "InstanceCapacity)Failure when resuming nodes) lost 1 time(s); compute1-dy-trn1-2 (down#: "
                             ), reason


def test_a_node_powering_down_after_a_failed_resume_is_not_available(head_nodes):
    # ParallelCluster powers a failed node down (idle%, then idle~) keeping the reason: not a node to wait for.
    captured = sinfo("sinfo_power_up_failed").stdout.splitlines()
    lines = [captured[0].replace("|down#|", "|idle%|").replace("(Code:InsufficientInstanceCapacity)", ""),
             "compute1*|up|1|idle~|compute1-dy-trn1-2|none"]
    out = CommandResult(0, "\n".join(lines) + "\n", "")
    verdict, reason, _, _ = check(head_nodes, out, described("create_complete"), num_nodes=2, lost=LostNodes(limit=0))
    assert verdict == FAILED and "compute1-dy-trn1-1 (idle%: Failure when resuming nodes)" in reason, reason
    # Powered down (idle~), the reason lingering: replaced, a node to use again.
    out = CommandResult(0, out.stdout.replace("|idle%|", "|idle~|"), "")
    assert check(head_nodes, out, described("create_complete"), num_nodes=2)[0] == READY
    assert check(head_nodes, out, described("create_complete"), num_nodes=1)[0] == READY


def test_nodes_that_stay_unusable_fail_the_wait_after_the_grace(head_nodes):
    # compute1: mixed# and allocated (busy), idle~, drained: 3 nodes could come free, so the wait goes on...
    assert check(head_nodes, sinfo("sinfo_powering_up"), described("create_complete"), num_nodes=3)[0] == PENDING
    # ...until the drained node has stayed so for stuck_after_s.
    verdict, reason, _, _ = check(head_nodes, sinfo("sinfo_powering_up"), described("create_complete"), num_nodes=3,
                                  stuck_after_s=0)
    assert verdict == FAILED and "compute1-st-trn1-2 (drained: Kernel panic on boot)" in reason, reason
    assert make_trigger(SinfoHeadNode(sinfo("sinfo_idle")), stuck_after_s=0).serialize()[1]["stuck_after_s"] == 0


def test_xcoms_that_cannot_be_pushed_leave_the_end_to_the_worker(first_contact, monkeypatch):
    from ultracluster.triggers import task_end

    class Refusing:
        @staticmethod
        async def aset(*_args, **_kwargs):
            raise ConnectionError("supervisor gone")

    monkeypatch.setattr(task_end, "XCom", Refusing)
    pinned = dict(host_key=HOST_KEY, host_key_cluster=cluster_identity(described("create_complete")))
    ended = run_to_end(in_triggerer(make_trigger(SinfoHeadNode(sinfo("sinfo_idle")), **pinned, end_task=True)),
                       FakePcluster(described("create_complete")), monkeypatch)
    assert type(ended).__name__ == "TriggerEvent" and ended.payload["status"] == "success"


def test_a_trigger_that_may_end_its_task_warms_the_execution_api_up_once_per_process(monkeypatch):
    from ultracluster.triggers import task_end

    asked = []
    monkeypatch.setattr(task_end, "get_dagrun_state", lambda dag_id, run_id: asked.append((dag_id, run_id)))
    monkeypatch.setitem(task_end._warmed, "done", False)

    async def start(trigger, end_task):
        task_end.warm_up(trigger, end_task)
        await asyncio.sleep(0.05)

    asyncio.run(start(make_trigger(SinfoHeadNode(sinfo("sinfo_idle"))), True))  # dag.test(): no task instance
    asyncio.run(start(in_triggerer(make_trigger(SinfoHeadNode(sinfo("sinfo_idle")))), False))  # not asked
    assert asked == []
    for _ in range(2):
        asyncio.run(start(in_triggerer(make_trigger(SinfoHeadNode(sinfo("sinfo_idle")))), True))
    assert asked == [("trn1_bert_pretrain", "manual__2026-12-03T10:00:00+00:00")]
