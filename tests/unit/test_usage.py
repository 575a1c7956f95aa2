"""Actual cost from EC2 instance lives: parsers.ec2.instance_life and cost.instance_usage."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ultracluster.parsers.ec2 import instance_life, transition_time
from ultracluster.run.cost import NO_PRICES, PRICES_ENV_VAR, instance_usage, load_prices, prices_for_billing

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def instance(node_type: str, itype: str, launched: datetime, state: str = "terminated",
             reason: str | None = None) -> dict:
    return {"InstanceId": f"i-{node_type}-{launched:%H%M}", "InstanceType": itype, "LaunchTime": launched,
            "State": {"Name": state}, "StateTransitionReason": reason or "",
            "Tags": [{"Key": "parallelcluster:node-type", "Value": node_type},
                     {"Key": "parallelcluster:cluster-name", "Value": "c1"}]}


@pytest.mark.parametrize("reason, expected", [
    ("User initiated (2026-12-01 05:31:46 GMT)", datetime(2026, 12, 1, 5, 31, 46, tzinfo=timezone.utc)),
    ("User initiated (2026-12-01 05:31:46 UTC)", datetime(2026, 12, 1, 5, 31, 46, tzinfo=timezone.utc)),
    ("Server.SpotInstanceTermination: Spot instance termination", None),
    ("", None), (None, None),
])
def test_the_termination_time_comes_from_the_state_transition_reason(reason, expected):
    assert transition_time(reason) == expected


def test_a_terminated_instance_bills_from_launch_to_termination():
    life = instance_life(instance("Compute", "trn1.32xlarge", NOW - timedelta(hours=3),
                                  reason="User initiated (2026-12-01 10:30:00 GMT)"), NOW)
    assert (life["hours"], life["ended"], life["node_type"]) == (1.5, "yes", "Compute")
    assert life["ended_at"] == "2026-12-01T10:30:00+00:00"


def test_a_live_instance_and_an_unreadable_end_are_counted_up_to_now_and_say_so():
    running = instance_life(instance("HeadNode", "c5.4xlarge", NOW - timedelta(hours=2), state="running"), NOW)
    unknown = instance_life(instance("Compute", "trn1.32xlarge", NOW - timedelta(hours=1), reason="gone"), NOW)
    assert (running["hours"], running["ended"]) == (2.0, "no")
    assert (unknown["hours"], unknown["ended"]) == (1.0, "unknown")


def test_usage_prices_each_instance_by_its_type_and_fsx_over_the_head_node_life():
    prices = load_prices()
    end = "User initiated (2026-12-01 12:00:00 GMT)"
    lives = [instance_life(i, NOW) for i in (
        instance("HeadNode", "c5.4xlarge", NOW - timedelta(hours=2), reason=end),
        # Dynamic nodes come and go: two lives of one node slot, and a second node.
        instance("Compute", "trn1.32xlarge", NOW - timedelta(hours=1.5), reason="User initiated (2026-12-01 11:00:00 GMT)"),
        instance("Compute", "trn1.32xlarge", NOW - timedelta(hours=0.5), reason=end),
        instance("Compute", "trn1.32xlarge", NOW - timedelta(hours=1), reason=end),
    )]
    usage = instance_usage(lives, prices, fsx_gib=1200)
    rate = prices["instances"]["trn1.32xlarge"]["usd_per_hour"]
    head_rate = prices["instances"]["c5.4xlarge"]["usd_per_hour"]
    fsx = 1200 * prices["fsx_lustre_scratch2_usd_per_gb_month"] * 2 / prices["hours_per_month"]
    assert (usage["instances"], usage["compute_node_hours"], usage["head_node_hours"]) == (4, 2.0, 2.0)
    assert usage["instance_hours"] == 4.0 and usage["unended"] == 0 and usage["unpriced_types"] == []
    assert usage["compute_usd"] == pytest.approx(2 * rate, abs=0.01)
    assert usage["head_node_usd"] == pytest.approx(2 * head_rate, abs=0.01)
    assert usage["fsx_usd"] == pytest.approx(fsx, abs=0.01)
    assert usage["usd"] == pytest.approx(2 * rate + 2 * head_rate + fsx, abs=0.02)


def test_an_unpriced_compute_type_leaves_the_total_unknown_not_low():
    lives = [instance_life(instance("Compute", "p9.mega", NOW - timedelta(hours=1), state="running"), NOW)]
    usage = instance_usage(lives, load_prices())
    assert usage["usd"] is None and usage["unpriced_types"] == ["p9.mega"] and usage["compute_node_hours"] == 1.0


def test_a_bill_without_a_readable_prices_file_keeps_its_hours_and_says_why(tmp_path, monkeypatch):
    warnings: list[str] = []
    assert prices_for_billing(warnings.append, "Node-hours") == load_prices()
    assert warnings == []
    monkeypatch.setenv(PRICES_ENV_VAR, str(tmp_path / "missing.json"))
    assert prices_for_billing(warnings.append, "Node-hours") is NO_PRICES
    [warning] = warnings
    assert warning.startswith("Node-hours only, no cost: Cannot read the prices file ") and "missing.json" in warning
