"""The local `pcluster build-image`: the build stack in moto, then a detached worker that runs the
configuration's script components in a scratch root and, when they succeed, makes the AMI in moto.

    python -m localcluster.image_build <image dir>

What stands in for EC2 Image Builder (docs/local-cluster.md, "Node images"):
- the build instance is this machine, seen through a private mount namespace in which /etc, /opt and
  /usr are writable overlays over a parent layer (the parent AMI's os-release, its EFA installer's
  fi_info) and the host's own; their upper layers are the image's scratch root
  (``<image dir>/root``): whatever the scripts install lands there, and the host stays as it was;
- apt-get, apt-cache, apt-mark, dkms, pip (a venv's ``python -m pip``), wget, curl and gpg are shims
  that record each call in ``<image dir>/calls.jsonl`` (image_shims.py) and reach no network; the
  Neuron apt repository is ``neuron_apt_repo.json``;
- a component that exits non-zero fails the build (BUILD_FAILED, Image Builder's reason with its
  output's tail); after the last one the AMI is created from the parent, tagged as pcluster's
  distribution and cleanup steps tag it, and the build stack deleted, as its cleanup function does.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from . import state
from .aws import Aws
from .image_shapes import IMAGE_ID_TAG, STATUS_TAG, official_os
from .images import image_dir, read_image, write_image
from .shapes import PCLUSTER_VERSION, iso_now

LOG = logging.getLogger("localcluster.image_build")
SCRIPTS = Path(__file__).resolve().parent / "scripts"
COMPONENT_TIMEOUT_S = 900
OVERLAID = ("etc", "opt", "usr")
# The parent AMI's /etc/os-release (Canonical's, as on ParallelCluster's AMIs of these OSes).
OS_RELEASE = {
    "ubuntu2204": ("22.04", "jammy", "22.04.5 LTS (Jammy Jellyfish)"),
    "ubuntu2404": ("24.04", "noble", "24.04.3 LTS (Noble Numbat)"),
}
SHIMMED = ("apt", "apt-get", "apt-cache", "apt-mark", "dkms", "wget", "curl", "gpg", "pip", "pip3", "python3")


def start_build(image_id: str, region: str, config_text: str, config: dict[str, Any], aws: Aws, *,
                rollback: bool) -> dict[str, Any]:
    """The build stack, the config in pcluster's bucket, the record; then the worker."""
    directory = image_dir(image_id)
    directory.mkdir(parents=True)
    bucket = aws.pcluster_bucket()
    aws.ensure_bucket(bucket)
    key = f"parallelcluster/{PCLUSTER_VERSION}/images/{image_id}-{secrets.token_hex(8)}/configs/image-config.yaml"
    aws.client("s3").put_object(Bucket=bucket, Key=key, Body=config_text.encode())
    tags = [(IMAGE_ID_TAG, image_id), ("parallelcluster:image_name", _image_name(config, image_id))]
    tags += [(t["Key"], t["Value"]) for t in (config.get("Build") or {}).get("Tags") or []]
    arn = aws.client("cloudformation").create_stack(
        StackName=image_id, Tags=[{"Key": k, "Value": v} for k, v in tags],
        TemplateBody=json.dumps({"Resources": {"ParallelClusterImage": {
            "Type": "AWS::CloudFormation::WaitConditionHandle"}}}))["StackId"]
    record = {"imageId": image_id, "region": region, "version": PCLUSTER_VERSION, "creationTime": iso_now(),
              "cloudformationStackStatus": "CREATE_IN_PROGRESS", "cloudformationStackArn": arn, "stackTags": tags,
              "imagebuilderImageStatus": "PENDING", "configBucket": bucket, "configKey": key,
              "rollbackOnFailure": rollback,
              "imageBuildLogsArn": f"arn:aws:logs:{region}:{aws.account_id()}:log-group:/aws/imagebuilder/"
                                   f"ParallelClusterImage-{image_id}"}
    (directory / "image-config.yaml").write_text(config_text)
    write_image(record)
    log = directory / "worker.log"
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "localcluster.image_build", str(directory)],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                   close_fds=True)
    record["buildWorkerPid"] = process.pid
    write_image(record)
    return record


def _image_name(config: dict[str, Any], image_id: str) -> str:
    return (config.get("Image") or {}).get("Name") or image_id


# --- the worker --------------------------------------------------------------------------------

def build(directory: Path) -> int:
    image_id = directory.name
    record = read_image(image_id)
    config = yaml.safe_load((directory / "image-config.yaml").read_text())
    aws = Aws(record["region"])
    build_cfg = config["Build"]
    _update(image_id, imagebuilderImageStatus="BUILDING")
    try:
        parent = aws.client("ec2").describe_images(ImageIds=[build_cfg["ParentImage"]])["Images"][0]
        os_name = _parent_os(parent)
        if os_name not in OS_RELEASE:
            return _fail(image_id, aws, f"the local UltraCluster builds on Ubuntu parents only, not {os_name}")
        if os.geteuid() != 0:
            return _fail(image_id, aws, "the local image build needs root (a mount namespace for the scratch root)")
        scripts = _fetch_components(aws, build_cfg.get("Components") or [], directory / "components")
        _parent_layer(directory / "parent", os_name)
        _shims(directory)
        for index, script in enumerate(scripts):
            code, tail = _run_component(directory, script)
            if code != 0:
                return _fail(image_id, aws, f"Workflow Step failed: ScriptComponent{index} ({script.name}) "
                                            f"exited {code}: {tail}")
        ami_id = _make_ami(aws, config, image_id, parent, os_name, record)
    except Exception:
        LOG.error("build failed:\n%s", traceback.format_exc())
        return _fail(image_id, aws, f"the local build failed: {traceback.format_exc().strip().splitlines()[-1]}")
    aws.client("cloudformation").delete_stack(StackName=image_id)   # the cleanup function's last act
    _update(image_id, cloudformationStackStatus="CREATE_COMPLETE", imagebuilderImageStatus="AVAILABLE",
            amiId=ami_id, buildWorkerPid=None)
    LOG.info("image %s built: %s", image_id, ami_id)
    return 0


def _update(image_id: str, **changes: Any) -> None:
    with state.cluster_lock(f"image-{image_id}"):
        record = read_image(image_id)
        if record is not None:   # deleted meanwhile
            record.update(changes)
            write_image(record)


def _fail(image_id: str, aws: Aws, reason: str) -> int:
    record = read_image(image_id) or {}
    status = "ROLLBACK_COMPLETE" if record.get("rollbackOnFailure") else "CREATE_FAILED"
    _update(image_id, cloudformationStackStatus=status, imagebuilderImageStatus="FAILED",
            imagebuilderImageStatusReason=reason, buildWorkerPid=None,
            cloudformationStackStatusReason="The following resource(s) failed to create: [ParallelClusterImage]. ")
    LOG.error("image %s: %s", image_id, reason)
    return 1


def _parent_os(parent: dict[str, Any]) -> str:
    tags = {t["Key"]: t["Value"] for t in parent.get("Tags") or []}
    found = official_os(parent.get("Name", ""))
    return tags.get("parallelcluster:os") or found


def _fetch_components(aws: Aws, components: list[dict], into: Path) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    scripts = []
    for index, component in enumerate(components):
        bucket, _, key = component["Value"].removeprefix("s3://").partition("/")
        path = into / f"{index}-{Path(key).name}"
        path.write_bytes(aws.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
        scripts.append(path)
    return scripts


def _parent_layer(layer: Path, os_name: str) -> None:
    """What the parent AMI has and this host lacks: its os-release, and EFA (ParallelCluster's AMIs
    carry the EFA installer's fi_info, which the node script checks before installing EFA)."""
    version, codename, pretty = OS_RELEASE[os_name]
    etc = layer / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "os-release").write_text(
        f'PRETTY_NAME="Ubuntu {pretty}"\nNAME="Ubuntu"\nVERSION_ID="{version}"\nVERSION="{pretty}"\n'
        f"VERSION_CODENAME={codename}\nID=ubuntu\nID_LIKE=debian\nUBUNTU_CODENAME={codename}\n")
    fi_info = layer / "opt" / "amazon" / "efa" / "bin" / "fi_info"
    fi_info.parent.mkdir(parents=True, exist_ok=True)
    fi_info.write_text('#!/bin/sh\n# The local stand-in of the EFA installer\'s fi_info.\n'
                       'echo "provider: efa"\necho "    fabric: efa"\n')
    fi_info.chmod(0o755)
    (layer / "usr").mkdir(exist_ok=True)


def _shims(directory: Path) -> None:
    shims = directory / "shims"
    shims.mkdir(exist_ok=True)
    for tool in SHIMMED:
        path = shims / tool
        path.write_text(f'#!/bin/sh\nexec "$UC_IMAGE_PYTHON" -m localcluster.image_shims {tool} "$@"\n')
        path.chmod(0o755)


def _run_component(directory: Path, script: Path) -> tuple[int, str]:
    """The script as Image Builder's component runs it (bash, as root, no arguments), in the scratch root."""
    home = directory / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": f"{directory / 'shims'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": str(home), "LANG": "C.UTF-8", "UC_IMAGE_PYTHON": sys.executable,
           "UC_IMAGE_CALLS": str(directory / "calls.jsonl"), "UC_IMAGE_LOG": str(directory / "build.log")}
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", str(SCRIPTS / "image-root.sh"),
            str(directory / "root"), str(directory / "parent"), str(directory / "work"), "--", "bash", str(script)]
    with open(directory / "build.log", "ab") as log:
        log.write(f"=== {datetime.now(UTC).isoformat()} running {script.name}\n".encode())
        log.flush()
        try:
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=COMPONENT_TIMEOUT_S, check=False)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 124
    lines = (directory / "build.log").read_text(errors="replace").splitlines()
    return code, " | ".join(lines[-5:])


def _make_ami(aws: Aws, config: dict[str, Any], image_id: str, parent: dict[str, Any], os_name: str,
              record: dict[str, Any]) -> str:
    """The AMI from the build instance (a moto instance of the parent), tagged as pcluster's distribution
    configuration (imagebuilder_stack._get_image_tags) and cleanup function (delete_image_stack) tag it."""
    ec2 = aws.client("ec2")
    name = _image_name(config, image_id)
    instance = ec2.run_instances(ImageId=parent["ImageId"], InstanceType=config["Build"]["InstanceType"],
                                 MinCount=1, MaxCount=1, TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                     {"Key": "Name", "Value": f"ParallelClusterImage-{image_id}"}]}])["Instances"][0]
    try:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S.000Z")
        ami_id = ec2.create_image(InstanceId=instance["InstanceId"], Name=f"{name} {stamp}",
                                  Description=f"AWS ParallelCluster image {image_id}")["ImageId"]
    finally:
        ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    artifacts = record["configKey"].rsplit("/configs/", 1)[0]
    tags = {t["Key"]: t["Value"] for t in (config.get("Image") or {}).get("Tags") or []}
    tags.update({"parallelcluster:image_name": name, "parallelcluster:version": PCLUSTER_VERSION,
                 IMAGE_ID_TAG: image_id, "parallelcluster:s3_bucket": record["configBucket"],
                 "parallelcluster:s3_image_dir": artifacts, "parallelcluster:build_log": record["imageBuildLogsArn"],
                 "parallelcluster:build_config": f"s3://{record['configBucket']}/{record['configKey']}",
                 "parallelcluster:os": os_name, STATUS_TAG: "available",
                 "parallelcluster:parent_image": parent["ImageId"]})
    ec2.create_tags(Resources=[ami_id], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    return ami_id


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    return build(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
