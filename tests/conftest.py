"""Shared pytest set-up. Fixtures for the local UltraCluster live in tests/fixtures_localcluster.py."""
from __future__ import annotations

import ipaddress
import os
import socket
import sys

import pytest

pytest_plugins = ["tests.fixtures_localcluster", "tests.fixtures_enforced"]


def work_unit(nodeid: str) -> str:
    """The work unit of a test under `make test`'s two pytest-xdist workers (--dist loadscope).

    The end-to-end tests share one Airflow deployment and run in order, so they form one unit.
    Every other module is a unit of its own: a module's fixtures (a local cluster, its slot range
    and accounting port) must never be built twice at once.
    """
    module = nodeid.split("::", 1)[0]
    return "tests/e2e" if module.startswith("tests/e2e/") else module


# xdist_group marks cannot do this: pytest-xdist 3.8.0's loadgroup rewrites Item._nodeid, which
# pytest 9.2 no longer reads. Its scheduler hook is the documented way to choose the units.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleAndE2e(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByModuleAndE2e(config, log)


@pytest.fixture(autouse=True)
def trigger_events_have_one_shape(monkeypatch):
    """Every event an ultracluster trigger emits while a test runs has run.events' shape."""
    from airflow.triggers.base import TriggerEvent

    from ultracluster.run.events import event_problems

    original = TriggerEvent.__init__

    def checked(self, payload, **kwargs):
        maker = sys._getframe(1).f_globals.get("__name__", "")
        if maker.startswith("ultracluster.triggers"):
            problems = event_problems(payload)
            assert not problems, f"{maker} emitted {payload!r}: {problems}"
        original(self, payload, **kwargs)

    monkeypatch.setattr(TriggerEvent, "__init__", checked)


class OffLoopback(OSError):
    """A test tried to reach an address outside 127.0.0.0/8 (the project's traffic rule)."""


def _loopback_only(connect):
    def guarded(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            try:
                allowed = ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
            except ValueError:  # a name: resolved by the caller before connect, never here
                allowed = False
            if not allowed:
                raise OffLoopback(f"connection to {address!r} refused by the tests' loopback guard")
        return connect(sock, address)
    return guarded


@pytest.fixture(autouse=True, scope="session")
def traffic_stays_on_loopback():
    """Every socket a test's process opens goes to 127.0.0.0/8 or ::1 (subprocesses are the real
    daemons', bound to loopback by their own configs). botocore's instance-metadata lookup is off:
    without credentials it would try 169.254.169.254."""
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    patch = pytest.MonkeyPatch()
    patch.setattr(socket.socket, "connect", _loopback_only(socket.socket.connect))
    patch.setattr(socket.socket, "connect_ex", _loopback_only(socket.socket.connect_ex))
    yield
    patch.undo()
