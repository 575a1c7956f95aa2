"""The local `pcluster` image verbs: build-image, describe-image, list-images, delete-image and
list-official-images, through the real binary, a real moto server and the detached build worker.

Every answer is checked against the pinned aws-parallelcluster 3.16.1's own API spec (its
openapi.yaml, strictly: no key the schema lacks). The build runs the rendered node set-up script in
a scratch root with recording shims (localcluster/image_build.py): the recorded calls carry the exact
pins of include/neuron-versions.env, and a broken script fails the build.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from tests.fixtures_localcluster import REGION, cli_env, run_pcluster
from ultracluster.run.neuron_versions import apt_specs, load_versions, pip_specs, render_on_node_configured, stamp

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / ".venvs" / "pcluster" / "lib" / "python3.11" / "site-packages" / "pcluster" / "api" / "openapi" \
    / "openapi.yaml"
APT_REPO = REPO / "localcluster" / "localcluster" / "neuron_apt_repo.json"
BUCKET = "ultracluster-artifacts"

pytestmark = [pytest.mark.localcluster,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="the local image build needs root and unshare (a mount namespace)")]


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    if not OPENAPI.exists():
        pytest.skip(f"{OPENAPI} missing: run `make setup`")
    return yaml.safe_load(OPENAPI.read_text())["components"]["schemas"]


def strict(schema: Any, schemas: dict[str, Any]) -> Any:
    """The spec's schema with its $refs resolved and no key outside an object's properties allowed."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return strict(schemas[schema["$ref"].rsplit("/", 1)[1]], schemas)
        out = {k: strict(v, schemas) for k, v in schema.items() if k not in ("example", "properties")}
        if "properties" in schema:
            out["properties"] = {name: strict(sub, schemas) for name, sub in schema["properties"].items()}
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item, schemas) for item in schema]
    return schema


def assert_shape(spec: dict[str, Any], name: str, answer: Any) -> None:
    import jsonschema

    jsonschema.validate(answer, strict(spec[name], spec))


@pytest.fixture(scope="module")
def uc_home(moto_server: str, tmp_path_factory) -> Path:
    """A home of its own: images need no cluster, so no `local-ultracluster up` (its daemons and dataset)."""
    home = tmp_path_factory.mktemp("uc-images")
    boto3.client("s3", region_name=REGION, endpoint_url=moto_server, aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
    return home


@pytest.fixture(scope="module")
def uc_env(uc_home: Path, moto_server: str) -> dict[str, str]:
    return cli_env(uc_home, moto_server)


@pytest.fixture(scope="module")
def pcluster(uc_env: dict[str, str]) -> Callable[..., tuple[int, Any]]:
    return lambda *args: run_pcluster(uc_env, *args)


@pytest.fixture(scope="module")
def aws(uc_env: dict[str, str]) -> Callable[[str], Any]:
    return lambda service: boto3.client(service, region_name=REGION, endpoint_url=uc_env["AWS_ENDPOINT_URL"],
                                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def image_config(uc_home: Path, aws, pcluster, spec) -> Callable[..., Path]:
    """An image configuration as trn1_build_image renders it: ParallelCluster's official AMI as parent, the
    script uploaded to moto as its one component."""
    code, official = pcluster("list-official-images", "--os", "ubuntu2204", "--architecture", "x86_64")
    assert code == 0, official
    assert_shape(spec, "ListOfficialImagesResponseContent", official)
    [parent] = official["images"]
    assert parent["os"] == "ubuntu2204" and parent["name"].startswith("aws-parallelcluster-3.16.1-ubuntu-2204-lts-hvm-")
    counter = iter(range(100))

    def make(script: str, **tags: str) -> Path:
        key = f"runs/images/test-{next(counter)}/image-setup.sh"
        aws("s3").put_object(Bucket=BUCKET, Key=key, Body=script.encode())
        config = {"Region": REGION, "Build": {"InstanceType": "trn1.2xlarge", "ParentImage": parent["amiId"],
                                              "Components": [{"Type": "script", "Value": f"s3://{BUCKET}/{key}"}],
                                              "UpdateOsPackages": {"Enabled": False}},
                  "Image": {"Name": "uc-test", "RootVolume": {"Size": 100},
                            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}}
        path = uc_home / f"image-config-{key.split('/')[2]}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    return make


def wait_for_image(pcluster, image_id: str, wanted: set[str], timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, found = pcluster("describe-image", "-i", image_id)
        if code == 0 and found["imageBuildStatus"] in wanted:
            return found
        assert time.monotonic() < deadline, f"{image_id} never reached {wanted}: {found}"
        time.sleep(0.5)


def calls(uc_home: Path, image_id: str) -> list[dict[str, Any]]:
    path = uc_home / "images" / image_id / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_node_script_builds_an_image_with_the_exact_pins(uc_home, pcluster, image_config, aws, spec):
    versions = load_versions()
    config = image_config(render_on_node_configured(), **{"ultracluster:neuron-release": versions["NEURON_RELEASE"]})
    code, started = pcluster("build-image", "-i", "uc-neuron-test", "-c", str(config))
    assert code == 0, started
    assert_shape(spec, "BuildImageResponseContent", started)
    assert started["image"]["imageBuildStatus"] == "BUILD_IN_PROGRESS"
    assert started["image"]["cloudformationStackStatus"] == "CREATE_IN_PROGRESS"
    code, pending = pcluster("list-images", "--image-status", "PENDING")
    assert code == 0 and pending["images"] in ([], [started["image"]])  # the build may be done already

    built = wait_for_image(pcluster, "uc-neuron-test", {"BUILD_COMPLETE", "BUILD_FAILED"})
    log = (uc_home / "images" / "uc-neuron-test" / "build.log").read_text()
    assert built["imageBuildStatus"] == "BUILD_COMPLETE", f"{built}\n{log}"
    assert_shape(spec, "DescribeImageResponseContent", built)
    tags = {t["key"]: t["value"] for t in built["ec2AmiInfo"]["tags"]}
    assert tags["ultracluster:neuron-release"] == "2.28.0"
    assert tags["parallelcluster:image_id"] == "uc-neuron-test" and tags["parallelcluster:build_status"] == "available"
    assert built["ec2AmiInfo"]["state"] == "AVAILABLE"

    # What the script did, shim by shim: the Neuron apt packages at their pins (the repository's builds
    # of them), held; the driver's DKMS module built; the venv's pip, then the exact pip set.
    recorded = calls(uc_home, "uc-neuron-test")
    installs = [c["argv"] for c in recorded if c["tool"] == "apt-get" and "install" in c["argv"]]
    repo = json.loads(APT_REPO.read_text())["packages"]
    neuron = next(argv for argv in installs if any(a.startswith("aws-neuronx-dkms=") for a in argv))
    for spec_ in apt_specs(versions):
        name, version = spec_.split("=")
        [resolved] = [a for a in neuron if a.startswith(f"{name}=")]
        assert resolved.split("=")[1].split("-")[0] == version and resolved.split("=")[1] in repo[name]
    assert {"tool": "apt-mark", "argv": ["hold", *[s.split("=")[0] for s in apt_specs(versions)]]} in recorded
    dkms = [c["argv"] for c in recorded if c["tool"] == "dkms"]
    assert dkms and dkms[0][:5] == ["install", "-m", "aws-neuronx", "-v", versions["NEURON_APT_PACKAGES"].split()[0]
                                    .split("=")[1]]
    pips = [c["argv"] for c in recorded if c["tool"] == "pip"]
    assert pips[0] == ["-m", "pip", "install", *versions["BOOTSTRAP_PIP_PACKAGES"].split()]
    assert pips[1] == ["-m", "pip", "install", "--extra-index-url", "https://pip.repos.neuron.amazonaws.com",
                       *versions["NEURON_PIP_PACKAGES"].split()]
    assert set(versions["NEURON_PIP_PACKAGES"].split()) | set(versions["BOOTSTRAP_PIP_PACKAGES"].split()) == set(
        pip_specs(versions))
    assert not [c for c in recorded if c["tool"] == "curl"]  # the parent's EFA was found: no installer fetched
    # The image holds what it installed, with the stamp compute nodes compare (the host kept nothing).
    root = uc_home / "images" / "uc-neuron-test" / "root"
    assert (root / "opt" / "ultracluster" / "neuron-image.done").read_text().strip() == stamp(versions)
    assert "jammy" in (root / "etc" / "apt" / "sources.list.d" / "neuron.list").read_text()
    assert not Path("/opt/ultracluster/neuron-image.done").exists()
    assert not Path("/opt/aws_neuron_venv_pytorch").exists()

    code, available = pcluster("list-images", "--image-status", "AVAILABLE")
    assert code == 0 and {"uc-neuron-test"} <= {i["imageId"] for i in available["images"]}
    assert_shape(spec, "ListImagesResponseContent", available)
    code, again = pcluster("build-image", "-i", "uc-neuron-test", "-c", str(config))
    assert code == 1 and again == {"message": "ParallelCluster image uc-neuron-test already exists."}

    ami = built["ec2AmiInfo"]["amiId"]
    # Refused while instances run on it (a cluster's nodes), as ParallelCluster refuses.
    instance = aws("ec2").run_instances(ImageId=ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    try:
        code, refused = pcluster("delete-image", "-i", "uc-neuron-test")
        assert code == 1 and refused == {"message": "Bad Request: Unable to delete image and stack: Image "
                                                    f"uc-neuron-test is used by instances ['{instance}']."}
    finally:
        aws("ec2").terminate_instances(InstanceIds=[instance])
    code, deleted = pcluster("delete-image", "-i", "uc-neuron-test")
    assert code == 0, deleted
    assert_shape(spec, "DeleteImageResponseContent", deleted)
    assert deleted["image"]["imageBuildStatus"] == "DELETE_IN_PROGRESS"
    code, gone = pcluster("describe-image", "-i", "uc-neuron-test")
    assert code == 1 and gone == {"message": "No image or stack associated with ParallelCluster image id: "
                                             "uc-neuron-test."}
    assert aws("ec2").describe_images(ImageIds=[ami])["Images"] == []
    assert not (uc_home / "images" / "uc-neuron-test").exists()


def test_a_broken_script_fails_the_build(uc_home, pcluster, image_config, spec):
    config = image_config("#!/bin/bash\nset -e\necho preparing\napt-get update\nfalse\necho never\n")
    code, started = pcluster("build-image", "-i", "uc-broken", "-c", str(config))
    assert code == 0, started
    failed = wait_for_image(pcluster, "uc-broken", {"BUILD_COMPLETE", "BUILD_FAILED"})
    assert failed["imageBuildStatus"] == "BUILD_FAILED", failed
    assert_shape(spec, "DescribeImageResponseContent", failed)
    assert failed["imagebuilderImageStatus"] == "FAILED" and failed["cloudformationStackStatus"] == "CREATE_FAILED"
    assert "ScriptComponent0" in failed["imagebuilderImageStatusReason"]
    assert "exited 1" in failed["imagebuilderImageStatusReason"]
    assert "ec2AmiInfo" not in failed
    assert calls(uc_home, "uc-broken") == [{"tool": "apt-get", "argv": ["update"]}]
    code, listed = pcluster("list-images", "--image-status", "FAILED")
    assert code == 0 and [i["imageId"] for i in listed["images"]] == ["uc-broken"]
    assert_shape(spec, "ListImagesResponseContent", listed)
    code, deleted = pcluster("delete-image", "-i", "uc-broken")
    assert code == 0 and deleted["image"]["cloudformationStackStatus"] == "DELETE_IN_PROGRESS", deleted
    assert pcluster("list-images", "--image-status", "FAILED")[1] == {"images": []}


def test_a_pin_the_repository_lacks_fails_the_build(uc_home, pcluster, image_config):
    script = render_on_node_configured().replace("aws-neuronx-tools=2.28.23.0", "aws-neuronx-tools=2.99.0.0")
    code, started = pcluster("build-image", "-i", "uc-bad-pin", "-c", str(image_config(script)))
    assert code == 0, started
    failed = wait_for_image(pcluster, "uc-bad-pin", {"BUILD_COMPLETE", "BUILD_FAILED"})
    assert failed["imageBuildStatus"] == "BUILD_FAILED"
    assert "aws-neuronx-tools 2.99.0.0 (Neuron 2.28.0) is not in the apt repositories" in (
        uc_home / "images" / "uc-bad-pin" / "build.log").read_text()
    assert pcluster("delete-image", "-i", "uc-bad-pin")[0] == 0


def test_what_build_image_refuses(uc_home, pcluster, image_config, spec):
    config = yaml.safe_load(image_config("#!/bin/bash\n").read_text())
    config["Build"]["ParentImage"] = "ami-0000000000000000f"
    path = uc_home / "bad-parent.yaml"
    path.write_text(yaml.safe_dump(config))
    code, refused = pcluster("build-image", "-i", "uc-refused", "-c", str(path))
    assert code == 1 and refused["message"] == "Configuration is invalid"
    assert refused["configurationValidationErrors"] == [{
        "level": "ERROR", "type": "InstanceTypeBaseAMICompatibleValidator",
        "message": "Invalid image 'ami-0000000000000000f'."}]
    assert_shape(spec, "BuildImageBadRequestExceptionResponseContent", refused)
    code, bad_id = pcluster("build-image", "-i", "1-bad", "-c", str(path))
    assert code == 1 and bad_id["message"].startswith("Bad Request: '1-bad' does not match")
    code, missing = pcluster("delete-image", "-i", "uc-nothing")
    assert code == 1 and missing["message"].startswith("No image or stack associated")
    code, unknown = pcluster("list-official-images", "--os", "centos7")
    assert code == 1 and unknown["message"].startswith("Bad Request: centos7 is not one of")


def test_the_stand_in_repository_holds_every_pinned_apt_version():
    """A pin changed in include/neuron-versions.env needs the stand-in repository to list it (or the
    local build fails as the real repository would on a wrong pin)."""
    repo = json.loads(APT_REPO.read_text())["packages"]
    for spec_ in apt_specs(load_versions()):
        name, version = spec_.split("=")
        assert any(v == version or v.startswith(f"{version}-") for v in repo.get(name, [])), spec_
