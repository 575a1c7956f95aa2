"""Synthesize a cluster's CloudFormation templates with aws-parallelcluster's own code, against a moto server.

Run by the pcluster venv's interpreter (.venvs/pcluster/bin/python, requirements-pcluster.lock), with
AWS_ENDPOINT_URL naming a loopback moto server that holds the config's subnets, key pair, AMI and S3
objects (tests/integration/test_pcluster_role_policy.py sets one up):

    .venvs/pcluster/bin/python scripts/pcluster_synth.py CONFIG.yaml --cluster-name NAME --out OUT.json \
        [--suppress-validators type:X ...]
    .venvs/pcluster/bin/python scripts/pcluster_synth.py IMAGE-CONFIG.yaml --image-id ID --out OUT.json

It runs ``pcluster.models.cluster.Cluster(name, config).create()``, the code behind `pcluster
create-cluster`: the config's validators, the cluster bucket and its uploads, and the CDK synthesis
(``CDKTemplateBuilder.build_cluster_template``; jsii runs it on Node.js). Its last step, CloudFormation's
``CreateStack``, is answered here and never sent (and so is the cluster bucket's ``PutBucketPolicy``,
whose deny-without-TLS moto's plain HTTP would meet). OUT.json holds ``{"pclusterVersion", "stackName",
"template", "nestedTemplates": {asset id: template}, "createStack": {its parameters}, "awsCalls":
[{"service", "operation", "params"}]}``: the calls the CLI made itself, in order.

With ``--image-id`` it does the same for `pcluster build-image`: ``pcluster.models.imagebuilder.
ImageBuilder(image_id, config).create()`` (the image's validators, the bucket, the CDK synthesis of the
image's build stack, ``CDKTemplateBuilder.build_imagebuilder_template``), its ``CreateStack`` answered
here. The controller's step before it, the account's build-image cleanup role, is not run: with a
permissions boundary the configuration names its own (``Build.Iam.CleanupLambdaRole``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

# The parameters that name a call's resource, kept in awsCalls (as tests/fixtures/aws_call_recorder does).
_RESOURCE_PARAMS = ("Bucket", "Key", "StackName", "RoleName", "InstanceProfileName", "PolicyArn", "FileSystemIds",
                    "TableName", "LogGroupName", "HostedZoneId", "SecretId", "Name")


def _loopback_only() -> None:
    """Any connection off 127.0.0.0/8 fails at once: the synthesis must reach nothing but moto."""
    original = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not str(address[0]).startswith(("127.", "::1")):
            raise OSError(f"pcluster_synth: connection to {address!r} refused (loopback only)")
        return original(sock, address)

    socket.socket.connect = connect  # type: ignore[method-assign]


def _record_calls(calls: list[dict], create_stack: dict) -> None:
    """Record every botocore call; answer CloudFormation's CreateStack without sending it."""
    import botocore.client

    original = botocore.client.BaseClient._make_api_call

    def make_api_call(client: Any, operation_name: str, api_params: dict) -> Any:
        service = client.meta.service_model.service_name
        kept = {key: api_params[key] for key in _RESOURCE_PARAMS if key in api_params}
        calls.append({"service": service, "operation": operation_name, "params": kept})
        if (service, operation_name) == ("cloudformation", "CreateStack"):
            create_stack.update(api_params)
            region = client.meta.region_name
            return {"StackId": f"arn:aws:cloudformation:{region}:000000000000:stack/{api_params['StackName']}/synth"}
        if (service, operation_name) == ("cloudformation", "DescribeStacks") and create_stack \
                and api_params.get("StackName") == create_stack["StackName"]:
            # build-image reads back the stack it just created (answered here: it never was).
            import datetime

            return {"Stacks": [{"StackName": create_stack["StackName"], "StackStatus": "CREATE_IN_PROGRESS",
                                "StackId": f"arn:aws:cloudformation:{client.meta.region_name}:000000000000:stack/"
                                           f"{create_stack['StackName']}/synth",
                                "CreationTime": datetime.datetime.now(datetime.timezone.utc),
                                "Tags": create_stack.get("Tags") or []}]}
        if (service, operation_name) == ("s3", "PutBucketPolicy"):
            # The cluster bucket's policy denies requests without TLS (aws:SecureTransport), and moto,
            # which serves plain HTTP and judges bucket policies, would then refuse every later call.
            return {}
        return original(client, operation_name, api_params)

    botocore.client.BaseClient._make_api_call = make_api_call  # type: ignore[method-assign]


def synthesize(config_text: str, cluster_name: str, suppress_validators: list[str]) -> dict[str, Any]:
    from pcluster.api.controllers.common import get_validator_suppressors
    from pcluster.models.cluster import Cluster
    from pcluster.templates import cdk_builder
    from pcluster.utils import get_installed_version
    from pcluster.validators.common import FailureLevel

    calls: list[dict] = []
    create_stack: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    _record_calls(calls, create_stack)

    build = cdk_builder.CDKTemplateBuilder.build_cluster_template

    def build_and_keep(*args: Any, **kwargs: Any) -> Any:
        template, assets = build(*args, **kwargs)
        # The nested stacks' templates (the queues' compute fleet) are CDK assets the CLI uploads.
        for asset in assets or []:
            nested[asset["s3_object_key_parameter"]["value"]] = asset["content"]
        return template, assets

    cdk_builder.CDKTemplateBuilder.build_cluster_template = staticmethod(build_and_keep)
    cluster = Cluster(cluster_name, config_text)
    cluster.create(validator_suppressors=get_validator_suppressors(suppress_validators),
                   validation_failure_level=FailureLevel.ERROR)
    if not create_stack:
        raise RuntimeError("pcluster returned without calling CloudFormation CreateStack")
    return {"pclusterVersion": get_installed_version(), "stackName": create_stack["StackName"],
            "template": cluster.template_body, "nestedTemplates": nested,
            "createStack": {k: v for k, v in create_stack.items() if k != "TemplateBody"}, "awsCalls": calls}


def synthesize_image(config_text: str, image_id: str) -> dict[str, Any]:
    from pcluster.models.imagebuilder import ImageBuilder
    from pcluster.utils import get_installed_version
    from pcluster.validators.common import FailureLevel

    calls: list[dict] = []
    create_stack: dict[str, Any] = {}
    _record_calls(calls, create_stack)
    builder = ImageBuilder(image_id=image_id, config=config_text)
    builder.create(disable_rollback=True, validator_suppressors=set(), validation_failure_level=FailureLevel.ERROR)
    if not create_stack:
        raise RuntimeError("pcluster returned without calling CloudFormation CreateStack")
    return {"pclusterVersion": get_installed_version(), "stackName": create_stack["StackName"],
            "template": builder.template_body, "nestedTemplates": {},
            "createStack": {k: v for k, v in create_stack.items() if k != "TemplateBody"}, "awsCalls": calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="cluster config YAML")
    names = parser.add_mutually_exclusive_group(required=True)
    names.add_argument("--cluster-name")
    names.add_argument("--image-id", help="a build-image configuration: synthesize the image's build stack")
    parser.add_argument("--out", required=True, help="where the JSON result goes")
    parser.add_argument("--suppress-validators", nargs="*", default=[], help="as `pcluster create-cluster`'s")
    args = parser.parse_args(argv)
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if not endpoint.startswith(("http://127.", "http://localhost")):
        parser.error("AWS_ENDPOINT_URL must name a loopback moto server: this never reaches an AWS account")
    _loopback_only()
    with open(args.config, encoding="utf-8") as handle:
        try:
            if args.image_id:
                result = synthesize_image(handle.read(), args.image_id)
            else:
                result = synthesize(handle.read(), args.cluster_name, args.suppress_validators)
        except Exception as err:  # a cluster's or an image's refusal: its validators' findings first
            for failure in getattr(err, "validation_failures", None) or []:
                print(f"{failure.level.name} {failure.validator_type}: {failure.message}", file=sys.stderr)
            raise
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
