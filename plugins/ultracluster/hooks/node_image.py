"""The node image's records in the account: the SSM parameter that names it, and its AMI's tags.

Thin: one method per API call, named after it.
"""
from __future__ import annotations

from typing import Any

from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook
from airflow.providers.amazon.aws.hooks.ssm import SsmHook
from botocore.exceptions import ClientError

_NO_IMAGE = ("InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable")


class NodeImageHook(SsmHook):
    """SsmHook (the parameter) plus EC2's DescribeImages, on the same connection."""

    def get_parameter(self, name: str) -> str | None:
        """The parameter's value; None when there is no such parameter."""
        try:
            return self.conn.get_parameter(Name=name)["Parameter"]["Value"]
        except ClientError as err:
            if err.response["Error"]["Code"] == "ParameterNotFound":
                return None
            raise

    def put_parameter(self, name: str, value: str, description: str) -> int:
        """Overwrite the parameter with an AMI id (data type ``aws:ec2:image``: SSM checks the image
        exists); returns its new version."""
        return int(self.conn.put_parameter(Name=name, Value=value, Description=description, Type="String",
                                           DataType="aws:ec2:image", Overwrite=True)["Version"])

    def describe_images(self, ami_id: str) -> dict[str, Any] | None:
        """The AMI's description; None when it does not exist (or is not visible to the account)."""
        ec2 = EC2Hook(aws_conn_id=self.aws_conn_id, region_name=self.region_name, api_type="client_type")
        try:
            images = ec2.conn.describe_images(ImageIds=[ami_id])["Images"]
        except ClientError as err:
            if err.response["Error"]["Code"] in _NO_IMAGE:
                return None
            raise
        return images[0] if images else None
