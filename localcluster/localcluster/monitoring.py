"""The cluster stack's monitoring resources, shaped as aws-parallelcluster 3.16.1 builds them
(pcluster/templates/cluster_stack.py: _add_cluster_log_group, _add_head_node_alarms).

- Log group `/aws/parallelcluster/<cluster>-<yyyymmddHHMM>` (Monitoring.Logs.CloudWatch.Enabled,
  default on), with the config's retention and DeletionPolicy (default Retain: it outlives the
  cluster). A resource of the stack: moto's CloudFormation creates and deletes it.
- Head-node metric alarms `<cluster>-HeadNode-<Metric>` and the composite alarm `<cluster>-HeadNode`
  (any of them), once the head node is up (they depend on its wait condition), unless
  Monitoring.Alarms.Enabled is false. moto's CloudFormation has no CloudWatch alarm types, so they
  are put through CloudWatch's API with the caller's credentials (the permissions pcluster's
  caller needs: cloudwatch:PutMetricAlarm, PutCompositeAlarm) and deleted with the stack.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

LOG_GROUP_PREFIX = "/aws/parallelcluster/"   # pcluster/constants.py CW_LOG_GROUP_NAME_PREFIX
# (namespace, metric, threshold, extra dimensions); pcluster's CW_ALARM_* defaults: period 60 s,
# 1 evaluation period, 1 datapoint, threshold 90 %.
HEAD_NODE_METRICS = {
    "Health": ("AWS/EC2", "StatusCheckFailed", 0.0, {}),
    "Cpu": ("AWS/EC2", "CPUUtilization", 90.0, {}),
    "Mem": ("CWAgent", "mem_used_percent", 90.0, {}),
    "Disk": ("CWAgent", "disk_used_percent", 90.0, {"path": "/"}),
}
HEARTBEAT = "ClustermgtdHeartbeat"   # only with the log group (a metric filter on clustermgtd's events)


def log_group_name(cluster_name: str, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d%H%M")
    return f"{LOG_GROUP_PREFIX}{cluster_name}-{stamp}"


def log_group_resource(cluster_name: str, retention_days: int, deletion_policy: str) -> dict[str, Any]:
    return {"Type": "AWS::Logs::LogGroup", "DeletionPolicy": deletion_policy,
            "Properties": {"LogGroupName": log_group_name(cluster_name), "RetentionInDays": retention_days}}


def alarm_names(cluster_name: str, with_heartbeat: bool) -> list[str]:
    metrics = [*HEAD_NODE_METRICS, *([HEARTBEAT] if with_heartbeat else [])]
    return [f"{cluster_name}-HeadNode-{metric}" for metric in metrics]


def put_head_node_alarms(cloudwatch: Any, cluster_name: str, head_instance_id: str, with_heartbeat: bool,
                         region: str, account_id: str) -> str:
    """The metric alarms, then the composite alarm over them; returns the composite alarm's name."""
    for name in alarm_names(cluster_name, with_heartbeat):
        metric = name.rsplit("-", 1)[1]
        if metric == HEARTBEAT:
            namespace, metric_name, threshold, extra = "ParallelCluster", HEARTBEAT, 1.0, {"ClusterName": cluster_name}
            options = {"EvaluationPeriods": 10, "DatapointsToAlarm": 10, "ComparisonOperator": "LessThanThreshold",
                       "TreatMissingData": "breaching"}
        else:
            namespace, metric_name, threshold, extra = HEAD_NODE_METRICS[metric]
            options = {"EvaluationPeriods": 1, "DatapointsToAlarm": 1, "ComparisonOperator": "GreaterThanThreshold",
                       "TreatMissingData": "missing"}
        dimensions = [{"Name": "InstanceId", "Value": head_instance_id}]
        dimensions += [{"Name": k, "Value": v} for k, v in extra.items()]
        cloudwatch.put_metric_alarm(AlarmName=name, Namespace=namespace, MetricName=metric_name,
                                    Dimensions=dimensions, Statistic="Maximum", Period=60, Threshold=threshold,
                                    **options)
    composite = f"{cluster_name}-HeadNode"
    arns = [f"arn:aws:cloudwatch:{region}:{account_id}:alarm:{n}" for n in alarm_names(cluster_name, with_heartbeat)]
    cloudwatch.put_composite_alarm(AlarmName=composite, AlarmRule=" OR ".join(f'ALARM("{a}")' for a in arns))
    return composite


def delete_head_node_alarms(cloudwatch: Any, cluster_name: str) -> None:
    """The composite alarm first (CloudWatch refuses to delete an alarm a composite still names)."""
    composite = f"{cluster_name}-HeadNode"
    cloudwatch.delete_alarms(AlarmNames=[composite])
    cloudwatch.delete_alarms(AlarmNames=alarm_names(cluster_name, with_heartbeat=True))
