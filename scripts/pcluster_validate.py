"""Validate a ParallelCluster v3 config with aws-parallelcluster's own schema, offline.

Run by the pcluster venv's interpreter (.venvs/pcluster/bin/python, requirements-pcluster.lock), never
by Airflow's: the two cannot share a venv.

    .venvs/pcluster/bin/python scripts/pcluster_validate.py CONFIG.yaml [MORE.yaml ...] [--cluster-name NAME]
    .venvs/pcluster/bin/python scripts/pcluster_validate.py --supported-oses

It does what `pcluster create-cluster` does before its first AWS call: the config's text through
``pcluster.models.common.parse_config``, then ``pcluster.schemas.cluster_schema.ClusterSchema(
cluster_name=...).load(...)`` (``pcluster.models.cluster.Cluster._load_config``): every key, type,
enum, range and the schema's own cross-field checks. The semantic validators that follow in the CLI
(``config.validate()``: subnets, instance types, AMIs, buckets) call AWS and are not run. Any AWS
call attempted all the same is refused and reported, so this can never reach an account. The refusal is
a botocore ClientError, as an unreachable AWS would give: the one call the schema's load makes on its
own, ``SlurmClusterConfig``'s cache of the capacity reservations the config names (their
``DescribeCapacityReservations``, a group's ``ListGroupResources``), tolerates it as it tolerates a
missing permission.

Prints one JSON object and exits 0 when the config is valid, 1 when it is not:
``{"valid", "pclusterVersion", "clusterName", "errors": [{"path", "message"}],
"configSchemaValidator": <the message pcluster would print>, "awsCalls": [<the refused calls>]}``. Given several
files it prints a JSON list of those, in order (one interpreter start: the package takes seconds to
import), and exits 1 when any is invalid.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _flatten(messages: Any, path: str = "") -> list[dict[str, str]]:
    """marshmallow's nested error messages as [{"path": "Scheduling/SlurmQueues/0/Name", "message"}]."""
    if isinstance(messages, dict):
        found: list[dict[str, str]] = []
        for key, value in messages.items():
            found += _flatten(value, f"{path}/{key}" if path else str(key))
        return found
    if isinstance(messages, (list, tuple)) and all(isinstance(m, str) for m in messages):
        return [{"path": path or "<root>", "message": m} for m in messages]
    if isinstance(messages, (list, tuple)):
        return [e for m in messages for e in _flatten(m, path)]
    return [{"path": path or "<root>", "message": str(messages)}]


def _refuse_aws_calls(attempted: list[str]) -> None:
    """Make every botocore API call fail at once (and record it): the check must stay offline."""
    import botocore.client
    from botocore.exceptions import ClientError

    def refuse(client: Any, operation_name: str, api_params: Any) -> Any:
        name = f"{client.meta.service_model.service_name}:{operation_name}"
        attempted.append(name)
        raise ClientError({"Error": {"Code": "OfflineSchemaCheck",
                                     "Message": f"offline schema check: AWS call {name} refused"}}, operation_name)

    botocore.client.BaseClient._make_api_call = refuse  # type: ignore[method-assign]


def validate(config_text: str, cluster_name: str) -> dict[str, Any]:
    from marshmallow import ValidationError
    from pcluster.models.common import parse_config
    from pcluster.schemas.cluster_schema import ClusterSchema
    from pcluster.utils import get_installed_version

    attempted: list[str] = []
    _refuse_aws_calls(attempted)
    result: dict[str, Any] = {
        "valid": False, "pclusterVersion": get_installed_version(), "clusterName": cluster_name,
        "errors": [], "configSchemaValidator": None, "awsCalls": attempted,
    }
    try:
        document = parse_config(config_text)
        ClusterSchema(cluster_name=cluster_name).load(document)
    except ValidationError as err:
        # What the CLI reports as ConfigSchemaValidator (Cluster._load_config).
        messages = err.messages
        result["configSchemaValidator"] = str(sorted(messages.items()) if isinstance(messages, dict) else err)
        result["errors"] = _flatten(messages)
    except Exception as err:  # parse_config's BadRequest, or a refused AWS call the load did not tolerate
        result["errors"] = [{"path": "<root>", "message": f"{type(err).__name__}: {err}"}]
        if attempted:
            result["errors"].append({"path": "<root>", "message": f"AWS calls attempted: {attempted}"})
    else:
        result["valid"] = True
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", help="cluster config YAML files ('-': stdin)")
    parser.add_argument("--cluster-name", default="uc-validate", help="name the schema checks against")
    parser.add_argument("--supported-oses", action="store_true",
                        help="print the Image.Os values this ParallelCluster accepts, as JSON, and exit")
    args = parser.parse_args(argv)
    # No profile, no credentials, no endpoint from the caller's environment can make this reach AWS.
    for key in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        os.environ.pop(key, None)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.supported_oses:
        # The schema's own choices for Image/Os (validate.OneOf(pcluster.constants.SUPPORTED_OSES)).
        from pcluster.schemas.cluster_schema import ImageSchema

        [choices] = [v.choices for v in ImageSchema._declared_fields["os"].validators if hasattr(v, "choices")]
        print(json.dumps(list(choices)))
        return 0
    if not args.configs:
        parser.error("a config file is required")
    results = []
    for path in args.configs:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        results.append(validate(text, args.cluster_name))
    print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    return 0 if all(r["valid"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
