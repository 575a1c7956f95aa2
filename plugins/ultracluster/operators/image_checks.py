"""preflight's node image check (docs/operations.md, "The node image"): which image the run's compute
nodes boot, and whether it holds the pinned Neuron stack.

The run's ``custom_ami`` if it names one, else what the profile's ``node_image_parameter`` (SSM) holds.
An image whose Neuron tags (``run.node_image``) differ from include/neuron-versions.env is refused, and
so is no image at all, unless the profile opts in to installing at boot (``install_neuron_at_boot``).
The image that applies goes into the plan (``custom_ami``), which render_config renders.
"""
from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

from ultracluster.hooks.node_image import NodeImageHook
from ultracluster.run import node_image
from ultracluster.run.errors import aws_error_code, is_transient
from ultracluster.run.neuron_versions import load_versions


def node_image_problems(plan: dict[str, Any], *, aws_conn_id: str | None, parameter: str | None,
                        install_at_boot: bool, log: Any) -> list[str]:
    """Problems with the image the plan's compute nodes would boot, one line each; sets the plan's
    ``custom_ami`` (None: ParallelCluster's own image, the stack installed at boot) and
    ``install_neuron_at_boot``."""
    plan["install_neuron_at_boot"] = install_at_boot
    versions = load_versions()
    hook = NodeImageHook(aws_conn_id=aws_conn_id, region_name=plan.get("region") or None)
    ami, source = plan.get("custom_ami") or None, "custom_ami"
    try:
        if not ami and parameter:
            ami, source = hook.get_parameter(parameter), f"custom_ami (empty): the node image parameter {parameter}"
        plan["custom_ami"] = ami
        if not ami:
            if install_at_boot:
                log.info("No node image (%s holds none): compute nodes install Neuron %s at boot "
                         "(install_neuron_at_boot)", parameter or "no node_image_parameter", versions["NEURON_RELEASE"])
                return []
            where = f"{parameter} holds none" if parameter else "the profile names no node_image_parameter"
            return [f"custom_ami: no node image ({where}), and this deployment does not install Neuron at boot "
                    f"(install_neuron_at_boot); {node_image.rebuild_hint(parameter)}"]
        image = hook.describe_images(ami)
    except ClientError as err:
        if is_transient(err):
            raise
        return [f"custom_ami: the node image could not be read ({source}): {aws_error_code(err) or err}"]
    except (NoCredentialsError, PartialCredentialsError) as err:
        return [f"custom_ami: the node image could not be checked: {err}"]
    tags = {t["Key"]: t.get("Value", "") for t in image.get("Tags") or []} if image else None
    problems = node_image.image_problems(ami, tags, versions, source)
    if not problems:
        log.info("Node image %s (%s): Neuron %s, commit %s", ami, source, tags.get(node_image.TAG_RELEASE),
                 tags.get(node_image.TAG_COMMIT, "?")[:12])
    return problems
