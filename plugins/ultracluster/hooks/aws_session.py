"""The boto3 sessions of every AWS hook: the amazon provider's ``[aws] session_factory``, whose
sessions share one botocore data loader.

The provider builds a new boto3 session per hook, and each new session reads and parses the JSON
service models and endpoint data again: a client costs about 70 ms for S3 and 260 ms for EC2 on a
2-core machine, against 9 ms on a session that has loaded them. With one loader per process, a
model is parsed once per process (the provider's own async sessions share its loader the same way),
and a worker forked from a process that loaded them (``executor.PreloadedLocalExecutor``) parses
none. The loader holds only botocore's and boto3's static data; credentials and regions stay per
session.

    AIRFLOW__AWS__SESSION_FACTORY=ultracluster.hooks.aws_session.SharedModelsSessionFactory
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import boto3
import botocore.loaders
import botocore.session

# What the pipeline's hooks call (plus the endpoint data every client needs): loaded by warm_up.
SERVICES = ("s3", "ec2", "cloudformation", "ssm", "service-quotas", "sts")

_loader = botocore.loaders.create_loader()
_lock = threading.Lock()


def shared_session(**session_kwargs: Any) -> boto3.session.Session:
    """A boto3 session (``boto3.session.Session``'s keyword arguments) on the process's loader."""
    core = botocore.session.get_session()
    core.register_component("data_loader", _loader)
    with _lock:
        session = boto3.session.Session(botocore_session=core, **session_kwargs)
        # boto3 appends its own data path to the loader of each new session: keep one of each.
        _loader.search_paths[:] = list(dict.fromkeys(_loader.search_paths))
    return session


def warm_up(services: Iterable[str] = SERVICES) -> None:
    """Parse the endpoint data and ``services``' models now (before a fork: the children share them)."""
    session = shared_session(region_name="us-east-1")
    for service in services:
        session.client(service, aws_access_key_id="warm-up", aws_secret_access_key="warm-up")


def __getattr__(name: str) -> Any:
    """``SharedModelsSessionFactory``, made on first use. base_aws resolves ``[aws] session_factory``
    while it is itself being imported: a class defined at this module's import would import base_aws
    first, and base_aws would then find this module half-made."""
    if name != "SharedModelsSessionFactory":
        raise AttributeError(name)
    from airflow.providers.amazon.aws.hooks.base_aws import BaseSessionFactory

    class SharedModelsSessionFactory(BaseSessionFactory):
        """The provider's session factory, its basic sessions on the shared loader (``shared_session``)."""

        def _create_basic_session(self, session_kwargs: dict[str, Any]) -> boto3.session.Session:
            return shared_session(**session_kwargs)

    SharedModelsSessionFactory.__qualname__ = name
    globals()[name] = SharedModelsSessionFactory
    return SharedModelsSessionFactory
