"""The IAM actions that create and delete each resource type of ParallelCluster's cluster stack.

CloudFormation's resource provider schemas name, per type, the permissions its create and delete
handlers need (``handlers.create.permissions``, ``handlers.delete.permissions``). cfn-lint ships those
schemas (cfnlint/data/schemas; cfn-lint is pinned in requirements-dev.txt); ``handler_actions`` reads
them. A handler's list covers every property of its type, so a permission that serves only properties
the template never sets is left out, with those properties named: ``UNUSED``, each entry checked
against the synthesized templates (``unused_problems``), so that a template that starts setting one
brings its permission back. Types that CloudFormation runs without a registry handler (FSx file
systems, wait conditions, custom resources) have no such list: ``LEGACY`` is a reviewed table with a
source for each row.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

REGION = "us-east-1"  # the provider schemas of the region the seed's config renders for


@dataclass(frozen=True)
class Legacy:
    create: tuple[str, ...]
    delete: tuple[str, ...]
    source: str


LEGACY: dict[str, Legacy] = {
    "AWS::FSx::FileSystem": Legacy(
        create=("fsx:CreateFileSystem", "fsx:TagResource", "fsx:DescribeFileSystems", "iam:CreateServiceLinkedRole"),
        delete=("fsx:DeleteFileSystem", "fsx:DescribeFileSystems"),
        source="FSx for Lustre User Guide, 'Using tags with Amazon FSx' (CreateFileSystem with tags, as "
               "CloudFormation passes the stack's, also authorizes fsx:TagResource) and 'Using service-linked "
               "roles for Amazon FSx' (the first file system creates AWSServiceRoleForAmazonFSx); ParallelCluster "
               "User Guide, 'Additional pcluster user policy when using Amazon FSx for Lustre' "
               "(iam:CreateServiceLinkedRole for fsx.amazonaws.com); CloudFormation polls DescribeFileSystems "
               "until the file system is AVAILABLE and until it is gone"),
    "AWS::CloudFormation::WaitConditionHandle": Legacy(
        create=(), delete=(),
        source="CloudFormation User Guide, 'AWS::CloudFormation::WaitConditionHandle': CloudFormation makes a "
               "presigned URL itself; there is no IAM action for it"),
    "AWS::CloudFormation::WaitCondition": Legacy(
        create=(), delete=(),
        source="CloudFormation User Guide, 'AWS::CloudFormation::WaitCondition': the head node signals the "
               "handle's presigned URL; the stack's principal needs no action for it"),
    "AWS::CloudFormation::CustomResource": Legacy(
        create=("lambda:InvokeFunction",), delete=("lambda:InvokeFunction",),
        source="CloudFormation User Guide, 'Lambda-backed custom resources': CloudFormation calls Lambda's "
               "Invoke API with the stack's principal on create, update and delete; ParallelCluster's base user "
               "policy grants lambda:InvokeFunction on its functions"),
}


@dataclass(frozen=True)
class Unused:
    """Permissions of a handler's list that serve only ``properties`` of ``type`` (top-level keys)."""
    type: str
    actions: tuple[str, ...]
    properties: tuple[str, ...]
    why: str


def _u(type_name: str, actions: str, properties: str, why: str) -> Unused:
    return Unused(type_name, tuple(actions.split()), tuple(properties.split()), why)


# Reviewed: write actions, and other services' actions, that serve only properties the stack does not
# set. Reads of the type's own resources, and what a delete handler lists for them, stay in the policy: a
# handler may call them whatever the properties, and a delete that fails leaves the resources behind.
# The rows for include/cluster/vpc.yaml's types (the Airflow role's stack) follow the same rule.
UNUSED: tuple[Unused, ...] = (
    _u("AWS::DynamoDB::Table", "dynamodb:UpdateTimeToLive", "TimeToLiveSpecification", "item expiry"),
    _u("AWS::DynamoDB::Table", "dynamodb:UpdateContributorInsights", "ContributorInsightsSpecification",
       "Contributor Insights"),
    _u("AWS::DynamoDB::Table", "dynamodb:UpdateContinuousBackups", "PointInTimeRecoverySpecification",
       "point-in-time recovery"),
    _u("AWS::DynamoDB::Table", "dynamodb:EnableKinesisStreamingDestination dynamodb:DisableKinesisStreamingDestination "
       "kinesis:DescribeStream kinesis:PutRecords", "KinesisStreamSpecification", "streaming to Kinesis"),
    _u("AWS::DynamoDB::Table", "iam:CreateServiceLinkedRole",
       "KinesisStreamSpecification ContributorInsightsSpecification",
       "the service-linked roles of Kinesis streaming and Contributor Insights"),
    _u("AWS::DynamoDB::Table", "dynamodb:ImportTable s3:GetObject s3:GetObjectMetadata s3:ListBucket "
       "logs:CreateLogGroup logs:CreateLogStream logs:DescribeLogGroups logs:DescribeLogStreams logs:PutLogEvents "
       "logs:PutRetentionPolicy", "ImportSourceSpecification", "an import from S3, logged to CloudWatch Logs"),
    _u("AWS::DynamoDB::Table", "dynamodb:PutResourcePolicy", "ResourcePolicy", "a resource policy"),
    _u("AWS::DynamoDB::Table",
       "kms:CreateGrant kms:Decrypt kms:DescribeKey kms:ListAliases kms:Encrypt kms:RevokeGrant", "SSESpecification",
       "encryption with a KMS key"),
    _u("AWS::EC2::Instance", "ec2:AssociateIamInstanceProfile ec2:DisassociateIamInstanceProfile "
       "ec2:ReplaceIamInstanceProfileAssociation", "IamInstanceProfile",
       "an instance profile on the instance; the head node's comes in its launch template, to RunInstances"),
    _u("AWS::EC2::Instance", "ec2:AttachVolume ec2:DetachVolume", "Volumes", "volumes attached after launch"),
    _u("AWS::EC2::Instance", "ec2:ModifyInstanceCreditSpecification", "CreditSpecification", "burstable credits"),
    _u("AWS::EC2::Instance", "ec2:ModifyInstancePlacement",
       "Affinity HostId HostResourceGroupArn Tenancy PlacementGroupName",
       "dedicated hosts and placement set on the instance"),
    _u("AWS::EC2::Instance", "ec2:ModifyPrivateDnsNameOptions", "PrivateDnsNameOptions", "private DNS name options"),
    _u("AWS::EC2::Instance", "ec2:MonitorInstances", "Monitoring", "detailed monitoring"),
    _u("AWS::EC2::Instance", "ssm:CreateAssociation", "SsmAssociations", "SSM associations"),
    _u("AWS::EC2::NetworkInterface", "ec2:ModifyPublicIpDnsNameOptions",
       "PublicIpDnsNameOptions PublicIpDnsHostnameTypeSpecification", "public DNS name options"),
    _u("AWS::IAM::Policy", "iam:GetUserPolicy iam:PutUserPolicy iam:DeleteUserPolicy", "Users",
       "policies of IAM users (the stack's go to its roles)"),
    _u("AWS::IAM::Policy", "iam:GetGroupPolicy iam:PutGroupPolicy iam:DeleteGroupPolicy", "Groups",
       "policies of IAM groups"),
    _u("AWS::Lambda::Function", "kms:CreateGrant kms:Decrypt kms:DescribeKey kms:Encrypt kms:GenerateDataKey",
       "KmsKeyArn", "environment encrypted with a KMS key"),
    _u("AWS::Lambda::Function", "elasticfilesystem:DescribeMountTargets s3files:ListMountTargets", "FileSystemConfigs",
       "a file system mounted in the function"),
    _u("AWS::Lambda::Function", "lambda:GetCodeSigningConfig", "CodeSigningConfigArn", "code signing"),
    _u("AWS::Lambda::Function", "lambda:GetLayerVersion", "Layers", "layers"),
    _u("AWS::Lambda::Function", "lambda:PutFunctionConcurrency", "ReservedConcurrentExecutions",
       "reserved concurrency"),
    _u("AWS::Lambda::Function", "lambda:PutRuntimeManagementConfig", "RuntimeManagementConfig", "runtime updates"),
    _u("AWS::Lambda::Function", "lambda:PutFunctionRecursionConfig", "RecursiveLoop", "recursion detection"),
    _u("AWS::Lambda::Function", "lambda:PutFunctionScalingConfig", "FunctionScalingConfig", "scaling limits"),
    _u("AWS::Lambda::Function", "lambda:PassCapacityProvider", "CapacityProviderConfig", "a capacity provider"),
    _u("AWS::Logs::LogGroup", "logs:PutDataProtectionPolicy", "DataProtectionPolicy", "a data protection policy"),
    _u("AWS::Logs::LogGroup", "logs:PutIndexPolicy", "FieldIndexPolicies", "field indexes"),
    _u("AWS::Logs::LogGroup", "logs:PutResourcePolicy", "ResourcePolicyDocument", "a resource policy"),
    _u("AWS::Logs::LogGroup", "logs:PutBearerTokenAuthentication", "BearerTokenAuthenticationEnabled",
       "bearer token authentication"),
    _u("AWS::Logs::LogGroup", "logs:CreateLogDelivery firehose:TagDeliveryStream", "LogGroupClass",
       "the DELIVERY class, which delivers logs to S3 or Firehose"),
    # Names in the handlers' lists that IAM's Service Authorization Reference (October 2026) does not know.
    _u("AWS::Logs::LogGroup", "s3:REST.PUT.OBJECT", "", "no IAM action: an S3 access-log operation name"),
    _u("AWS::Lambda::Function", "lambda:AssociateRuntimeAlias", "", "no IAM action"),
    _u("AWS::Route53::HostedZone", "route53:CreateQueryLoggingConfig", "QueryLoggingConfig", "DNS query logging"),
    # include/cluster/vpc.yaml's types.
    _u("AWS::EC2::VPC", "ec2:CreateVpcEncryptionControl", "VpcEncryptionControl", "VPC encryption control"),
    _u("AWS::EC2::EIP", "ec2:AcceptAddressTransfer", "TransferAddress", "an address transferred from another account"),
    _u("AWS::EC2::EIP", "ec2:AssociateAddress", "InstanceId", "an address on an instance (vpc.yaml's is the NAT "
       "gateway's, which the gateway associates)"),
    _u("AWS::EC2::VPCGatewayAttachment", "ec2:AttachVpnGateway ec2:DetachVpnGateway ec2:DescribeVpnGateways",
       "VpnGatewayId", "a VPN gateway (vpc.yaml attaches an internet gateway)"),
    _u("AWS::EC2::VPCEndpoint", "vpc-lattice:CreateServiceNetworkVpcEndpointAssociation "
       "vpc-lattice:DescribeServiceNetworkVpcEndpointAssociation", "ServiceNetworkArn",
       "an endpoint into a VPC Lattice service network (vpc.yaml's is an S3 gateway endpoint)"),
    _u("AWS::EC2::VPCEndpoint", "vpce:AllowMultiRegion", "ServiceRegion", "an endpoint to another region's service"),
    # The node image's build stack (pcluster build-image; tests/integration/test_pcluster_image_policy.py).
    _u("AWS::ImageBuilder::Image", "ecr:BatchGetRepositoryScanningConfiguration inspector2:BatchGetAccountStatus",
       "ImageScanningConfiguration", "image scanning with Inspector"),
    _u("AWS::ImageBuilder::Image", "imagebuilder:GetContainerRecipe", "ContainerRecipeArn", "container images"),
    _u("AWS::ImageBuilder::Image", "imagebuilder:GetWorkflow", "Workflows", "custom build workflows"),
    _u("AWS::ImageBuilder::Image", "imagebuilder:StartImagePipelineExecution", "ImagePipelineExecutionSettings",
       "an image pipeline's execution"),
    _u("AWS::ImageBuilder::Component", "kms:GenerateDataKey kms:GenerateDataKeyPair "
       "kms:GenerateDataKeyPairWithoutPlaintext kms:GenerateDataKeyWithoutPlaintext kms:Encrypt kms:Decrypt",
       "KmsKeyId", "a component encrypted with a KMS key"),
    _u("AWS::ImageBuilder::Component", "s3:HeadBucket", "Uri",
       "a component document in S3 (the stack's carry theirs inline, in Data); no IAM action either"),
    _u("AWS::SNS::Topic", "sns:PutDataProtectionPolicy", "DataProtectionPolicy", "a data protection policy"),
    # Nested in Distributions[] (LaunchTemplateConfigurations, SsmParameterConfigurations), which the
    # image policy test checks are absent: no top-level property to name.
    _u("AWS::ImageBuilder::DistributionConfiguration", "ec2:CreateLaunchTemplateVersion ec2:ModifyLaunchTemplate "
       "ssm:GetParameter", "", "launch template and SSM parameter distribution, in Distributions[]"),
)


def resource_types(templates: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each resource type of the templates, with the logical ids that have it."""
    found: dict[str, list[str]] = {}
    for template in templates:
        for logical_id, resource in (template.get("Resources") or {}).items():
            found.setdefault(resource["Type"], []).append(logical_id)
    return dict(sorted(found.items()))


def resources_of(templates: Iterable[Mapping[str, Any]], type_name: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for template in templates:
        for logical_id, resource in (template.get("Resources") or {}).items():
            if resource["Type"] == type_name:
                yield logical_id, resource.get("Properties") or {}


def _schema_type(type_name: str) -> str:
    return "AWS::CloudFormation::CustomResource" if type_name.startswith("Custom::") else type_name


def handler_actions(type_name: str) -> dict[str, list[str]] | None:
    """``{"create": [...], "delete": [...]}`` from the type's provider schema; None without handlers."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(REGION, _schema_type(type_name)).schema
    handlers = schema.get("handlers")
    if not handlers:
        return None
    return {phase: list((handlers.get(phase) or {}).get("permissions") or []) for phase in ("create", "delete")}


def required_actions(templates: list[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """{action: {resource type: where the action comes from}} for every type of the templates.

    A type with neither handlers nor a LEGACY row raises: it needs a reviewed row first."""
    needed: dict[str, dict[str, str]] = {}
    unused = {(u.type, action) for u in UNUSED for action in u.actions}
    for type_name in resource_types(templates):
        handlers = handler_actions(type_name)
        if handlers is None:
            row = LEGACY.get(_schema_type(type_name))
            if row is None:
                raise KeyError(f"{type_name} has no handler permissions in cfn-lint's schemas and no LEGACY row")
            sources = {"create": row.create, "delete": row.delete}
            origin = "LEGACY"
        else:
            sources, origin = handlers, "provider schema"
        for phase, actions in sources.items():
            for action in actions:
                if (type_name, action) not in unused:
                    needed.setdefault(action, {})[type_name] = f"{origin} {phase}"
    return dict(sorted(needed.items()))


def unused_problems(templates: list[Mapping[str, Any]]) -> list[str]:
    """Entries of UNUSED the templates contradict: a property set after all, or an action the schema lacks."""
    problems = []
    for entry in UNUSED:
        handlers = handler_actions(entry.type) or {}
        listed = set(handlers.get("create", [])) | set(handlers.get("delete", []))
        problems += [f"{entry.type}: {a} is not in its handlers' permissions" for a in entry.actions if a not in listed]
        for logical_id, properties in resources_of(templates, entry.type):
            problems += [f"{logical_id} ({entry.type}) sets {p}: {', '.join(entry.actions)} are needed"
                         for p in entry.properties if p in properties]
    return problems


def resolve(value: Any, pseudo: Mapping[str, str]) -> Any:
    """``value`` with the intrinsic functions ParallelCluster's names use (Ref of a pseudo parameter,
    Fn::Join, Fn::Select, Fn::Split, Fn::Sub of pseudo parameters) worked out; other Refs stay."""
    if isinstance(value, list):
        return [resolve(item, pseudo) for item in value]
    if not isinstance(value, dict) or len(value) != 1:
        return value
    [(function, argument)] = value.items()
    if function == "Ref" and argument in pseudo:
        return pseudo[argument]
    if function == "Fn::Join":
        parts = resolve(argument[1], pseudo)
        return argument[0].join(parts) if all(isinstance(p, str) for p in parts) else value
    if function == "Fn::Select":
        items = resolve(argument[1], pseudo)
        return items[int(argument[0])] if isinstance(items, list) else value
    if function == "Fn::Split":
        text = resolve(argument[1], pseudo)
        return text.split(argument[0]) if isinstance(text, str) else value
    if function == "Fn::Sub" and isinstance(argument, str):
        for name, replacement in pseudo.items():
            argument = argument.replace("${" + name + "}", replacement)
        return argument
    return value
