"""preflight: everything knowable before the first create, in one visible step.

It fixes the run's plan (the params with its sweep point applied; every later task reads the plan),
checks the cross-field rules once, the tags, and what AWS can tell (``account_checks``: the dataset
object, the artifacts and compile-cache buckets, the key pair, the instance types offered in the AZ
id, the Trn vCPU quota, the capacity reservation (``capacity_checks``); a bucket without a public
access block is a warning), the node image the compute nodes boot (``image_checks``: its Neuron tags
against include/neuron-versions.env; none only where the profile installs at boot), estimates the
cost (at the reservation's price where it is known) and enforces ``max_cost_usd``, and (where the profile asks: ``estimate_boot_time``) estimates a compute
node's boot against ParallelCluster's bootstrap timeout, a warning at 70 % of it (``run.boot_time``). Every problem found goes into one error naming each param; such
failures are the conf's own and fail the task at once, without retries. Transient AWS errors (throttling, an unreachable endpoint) raise and retry.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from botocore.exceptions import BotoCoreError, ClientError

from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.operators.account_checks import account_problems, public_access_warnings
from ultracluster.operators.existing_cluster import existing_cluster_problems
from ultracluster.operators.image_checks import node_image_problems
from ultracluster.run import boot_time
from ultracluster.run import capacity as run_capacity
from ultracluster.run import existing_cluster as byo
from ultracluster.run.cost import PriceError, estimate, load_prices
from ultracluster.run.errors import counted, problem_list
from ultracluster.run.names import safe_run_id
from ultracluster.run.node_iam import iam_problems
from ultracluster.run.plan import plan_problems, run_plan
from ultracluster.run.s3 import check_sse
from ultracluster.run.shared_cluster import SharedClusterError, holder_plan
from ultracluster.run.ssh_access import effective_cidr, flag, ssh_problems, ssh_warnings
from ultracluster.run.sweep import SweepError, describe_point, write_index_entry
from ultracluster.run.tags import tag_problems

if TYPE_CHECKING:
    from airflow.sdk import Context


class PreflightOperator(BaseOperator):
    """
    Return ``{"plan": {...}, "estimate": {...}, "boot": {...} | None, "warnings": [...],
    "reservations": [...]}``
    (docs/contracts.md, "Scaling sweeps"); ``warnings``: what preflight found worth a look but not a
    failure (a bucket that does not block public access, an unreadable checksum sidecar, a node boot
    near its timeout, a price not known), also in the task log; ``boot``: ``run.boot_time.estimate`` (None:
    not estimated); ``reservations``: the capacity reservations the run targets (``run.capacity.summary``).

    :param schedule_period: the DAG's tick length; a backfilled sweep run picks its point from
        the tick index of its logical date.
    :param artifacts_s3_uri: where a sweep run is indexed (``sweeps/<dag_id>/<sweep_id>/runs/``).
    :param s3_encryption: server-side encryption of the write probe and the sweep index
        (``s3_encryption.sse_args``; None: SSE-S3).
    :param estimate_boot_time: estimate a compute node's boot (the production profile's
        ``estimate_boot_time``; the local cluster's nodes boot in seconds and are not estimated).
    :param reservation_lead_s: how long after preflight a capacity reservation may start: the run's
        nodes need it by then (the DAG passes the fleet wait's timeout).
    :param default_ssh_allowed_cidr: the deployment's ``head_node_ssh_cidr``, the plan's
        ``ssh_allowed_cidr`` when the run names none (``run.ssh_access.effective_cidr``).
    :param permissions_boundary_arn: the profile's boundary of the roles pcluster creates; refused when
        empty and ``require_permissions_boundary`` (every profile but the local one's).
    :param node_kms_policy_arn: the profile's managed policy giving the nodes ``kms:Decrypt`` on a
        customer managed key (``run.node_iam``).
    :param pcluster_conn_id: where a run on an existing cluster (``existing_cluster_name``) finds it:
        it must exist, be complete and have the run's queue, instance type, nodes and shared storage
        (``operators.existing_cluster``); the head node, the cluster's network and its SSH access are
        then the cluster's, and the estimate prices the run's nodes only.
    :param node_image_parameter: the profile's SSM parameter naming the node image (a run's
        ``custom_ami`` overrides it); the plan's ``custom_ami`` is the image that applies.
    :param install_neuron_at_boot: the profile's opt-in: without a node image, compute nodes install
        the Neuron stack at boot (else preflight refuses the run); into the plan for render_config.
    :param trains: False for the holder of a sweep's shared cluster (trn1_sweep_cluster), which trains
        nothing: its plan is ``run.shared_cluster.holder_plan`` (a cluster of the sweep's largest
        point) and the training-only rules are left to the points' own preflights.
    """

    template_fields: Sequence[str] = ("artifacts_s3_uri", "max_cost_usd")
    ui_color = "#e8f1d4"

    def __init__(self, *, schedule_period: timedelta, artifacts_s3_uri: str, max_cost_usd: Any = None,
                 aws_conn_id: str | None = "aws_default", s3_encryption: Mapping[str, str] | None = None,
                 estimate_boot_time: bool = False, reservation_lead_s: int = 0,
                 default_ssh_allowed_cidr: str | None = None, permissions_boundary_arn: str | None = None,
                 require_permissions_boundary: bool = True, node_kms_policy_arn: str | None = None,
                 pcluster_conn_id: str = "pcluster_default", node_image_parameter: str | None = None,
                 install_neuron_at_boot: bool = False, trains: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trains = trains
        self.pcluster_conn_id = pcluster_conn_id
        self.permissions_boundary_arn = permissions_boundary_arn
        self.require_permissions_boundary = require_permissions_boundary
        self.node_kms_policy_arn = node_kms_policy_arn
        self.node_image_parameter = node_image_parameter or None
        self.install_neuron_at_boot = install_neuron_at_boot
        self.default_ssh_allowed_cidr = default_ssh_allowed_cidr
        self.reservation_lead_s = reservation_lead_s
        self.s3_encryption = check_sse(s3_encryption)
        self.schedule_period = schedule_period
        self.artifacts_s3_uri = artifacts_s3_uri
        self.max_cost_usd = max_cost_usd
        self.aws_conn_id = aws_conn_id
        self.estimate_boot_time = estimate_boot_time

    def execute(self, context: Context) -> dict[str, Any]:
        try:
            plan = (run_plan(dict(context["params"]), context.get("logical_date"), self.schedule_period)
                    if self.trains else holder_plan(dict(context["params"])))
        except (SweepError, SharedClusterError) as err:
            raise AirflowFailException(str(err)) from None
        # The head node's SSH CIDR render_config renders: the run's, else the deployment's.
        plan["ssh_allowed_cidr"] = effective_cidr(plan.get("ssh_allowed_cidr"), self.default_ssh_allowed_cidr)
        point, existing = plan["sweep_point"], byo.existing_cluster(plan)
        if point:
            self.log.info("%s", describe_point(point))
        try:
            prices = load_prices()
            expected = estimate(byo.billed_plan(plan), prices)
        except PriceError as err:
            raise AirflowFailException(f"cost estimate: {err}") from None
        if point:  # before the checks: a point that fails them has ended too, for its holder and its report
            self._index(context, plan, expected, before_checks=True)
        problems = plan_problems(plan, trains=self.trains)
        problems += tag_problems(plan.get("extra_tags"))
        warnings: list[str] = []
        if existing:
            problems += existing_cluster_problems(plan, self.pcluster_conn_id, self.log, warnings)
        else:  # the production profile leaves the head node's CIDR to the deployment, and refuses without it
            problems += ssh_problems(plan.get("ssh_allowed_cidr"), flag(plan.get("allow_world_ssh")))
            # The deployment's IAM: the boundary of the cluster's roles, the nodes' KMS grant (run.node_iam).
            problems += iam_problems(self.s3_encryption, self.node_kms_policy_arn, self.permissions_boundary_arn,
                                     self.require_permissions_boundary)
        now = datetime.now(timezone.utc)
        capacity = {"run_hours": expected["hours"], "now": now, "found": [],
                    "needed_by": now + timedelta(seconds=int(self.reservation_lead_s))}
        # The account's answers are independent: asked at once, they take the slowest one's time.
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="preflight") as pool:
            account = pool.submit(account_problems, plan, self.aws_conn_id,
                                  f"{safe_run_id(context['run_id'])}.probe", prices, self.log, sse=self.s3_encryption,
                                  warnings=warnings, capacity=capacity)
            # A standing cluster's nodes run the image it was made with.
            image = None if existing else pool.submit(
                node_image_problems, plan, aws_conn_id=self.aws_conn_id, parameter=self.node_image_parameter,
                install_at_boot=self.install_neuron_at_boot, log=self.log)
            public = pool.submit(public_access_warnings, plan, self.aws_conn_id)
            problems += account.result()
            problems += image.result() if image else []
        if problems:
            raise AirflowFailException(problem_list(
                f"preflight found {counted(problems, 'problem')}, nothing was created", problems))
        price = run_capacity.node_price(plan, capacity["found"], expected["usd_per_node_hour"])
        expected = estimate(byo.billed_plan(plan), prices, node_price=price)
        if not price["known"]:
            warnings.append(f"cost estimate: {price['note']}")
        self.log.info(
            "Cost estimate: $%.2f (%d × %s for %.2f h at $%.2f/h (%s), head node $%.2f, FSx $%.2f)",
            expected["usd"], plan["num_nodes"], expected["instance_type"], expected["hours"],
            expected["usd_per_node_hour"], price["basis"], expected["head_node_usd"], expected["fsx_usd"],
        )
        limit = self._max_cost()
        if limit is not None and expected["usd"] > limit:
            raise AirflowFailException(
                f"max_cost_usd: the estimate ${expected['usd']:.2f} exceeds the limit ${limit:.2f}; "
                "lower num_nodes or steps_this_run, or raise max_cost_usd"
            )
        warnings += public.result()
        if not existing:  # an existing cluster's head node and nodes are as it made them
            warnings += ssh_warnings(plan.get("ssh_allowed_cidr"), flag(plan.get("allow_world_ssh")))
        boot = self._boot(plan, warnings) if self.estimate_boot_time and not existing else None
        for warning in warnings:
            self.log.warning("%s", warning)
        if point:  # again, with the estimate at the price found
            self._index(context, plan, expected)
        return {"plan": plan, "estimate": expected, "boot": boot, "warnings": warnings,
                "reservations": [run_capacity.summary(r) for r in capacity["found"]]}

    def _boot(self, plan: dict, warnings: list[str]) -> dict:
        """A compute node's boot time against the bootstrap timeout; a warning at 70 % or more."""
        try:
            table = boot_time.load_boot_steps()
        except boot_time.BootTableError as err:
            raise AirflowFailException(f"boot time estimate: {err}") from None
        boot = boot_time.estimate(table, instance_type=plan["instance_type"], prebuilt=bool(plan.get("custom_ami")),
                                  nodes=boot_time.nodes_at_once(plan["num_nodes"], plan.get("min_nodes") or 0))
        self.log.info("Preflight %s (table: %s)", boot_time.describe(boot), table["file"])
        warning = boot_time.boot_warning(boot, table["warn_at_share"]["value"])
        if warning:
            warnings.append(warning)
        return boot

    def _max_cost(self) -> float | None:
        if self.max_cost_usd in (None, "", "None"):
            return None
        try:
            return float(self.max_cost_usd)
        except (TypeError, ValueError):
            raise AirflowFailException(f"max_cost_usd must be a number, got {self.max_cost_usd!r}") from None

    def _index(self, context: Context, plan: dict, expected: dict, *, before_checks: bool = False) -> None:
        """Record this run under its sweep, where the scaling report and a holder find it. Before the
        checks a failed write is only a warning: the checks then name what is wrong with the bucket."""
        s3 = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption)
        try:
            uri = write_index_entry(s3, self.artifacts_s3_uri, context["dag"].dag_id, context["run_id"], plan,
                                    expected)
        except (BotoCoreError, ClientError, ValueError) as err:
            if not before_checks:
                raise
            self.log.warning("Sweep %s: could not index this run before the checks: %s", plan["sweep_point"]["id"],
                             err)
            return
        self.log.info("Sweep %s indexed at %s", plan["sweep_point"]["id"], uri)
