#!/bin/bash
# ParallelCluster OnNodeConfigured action for Trn1 nodes on Ubuntu 22.04 (Image.Os ubuntu2204; the
# pinned Neuron release supports torch-neuronx training there).
#
# render_config uploads a RENDERED copy of this file to the artifacts bucket and references it from
# the head node and every queue: the block between "# BEGIN VERSIONS" and "# END VERSIONS" then holds
# the exact versions of include/neuron-versions.env (plugins/ultracluster/run/neuron_versions.py;
# `python -m ultracluster.run.neuron_versions render` prints the copy). This file as it is does not run.
# It runs as root once a node is configured, on every node that boots (dynamic nodes included), so it
# is idempotent: a marker records the Neuron release and the pins a node finished with, and a node
# whose marker matches does nothing.
#
# What it installs on Trn1/Trn1n compute nodes:
#   1. the Neuron apt repository (signed-by keyring); the driver (aws-neuronx-dkms), runtime and
#      collectives (aws-neuronx-runtime-lib, aws-neuronx-collectives) and tools (aws-neuronx-tools:
#      neuron-top, neuron-ls), each at its pinned version, then held;
#   2. EFA, only where the image lacks it (ParallelCluster's AMIs ship it when Efa.Enabled), with the
#      pinned EFA installer;
#   3. the Neuron PyTorch venv at $NEURON_VENV with the pinned pip packages (torch-neuronx, torch,
#      torch-xla, neuronx-cc, transformers, h5py), whose installed versions are then checked
#      (training_python in the production profile points at $NEURON_VENV/bin/python).
# A compute node whose image already holds the pinned stack installs nothing: the node image built
# with the same rendered script (trn1_build_image's pcluster build-image component: no cfnconfig
# there, or `--image`) carries an image marker with the same stamp (`--stamp` prints it). Any other
# compute node installs at boot only where the rendered NEURON_INSTALL_AT_BOOT is true (the profile's
# install_neuron_at_boot opt-in); otherwise it fails, naming the image to build. The head node (no
# Neuron device, runs no training) gets nothing but the marker.
#
# A non-zero exit makes ParallelCluster report OnNodeConfiguredExecutionFailure for the node.
# UC_STATE_DIR and UC_CFNCONFIG move the markers and the node-type file (tests only).
set -euo pipefail

# BEGIN VERSIONS (replaced by render_config; edit include/neuron-versions.env, not this block)
# @VERSIONS@
# END VERSIONS
: "${NEURON_RELEASE:?versions not rendered: upload the copy render_config makes (python -m ultracluster.run.neuron_versions render)}"
: "${NEURON_INSTALL_AT_BOOT:?not rendered: upload the copy render_config makes}"

NEURON_VENV=/opt/aws_neuron_venv_pytorch
NEURON_APT_REPO=https://apt.repos.neuron.amazonaws.com
NEURON_PIP_REPO=https://pip.repos.neuron.amazonaws.com
EFA_INSTALLER_URL="https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz"
STATE_DIR=${UC_STATE_DIR:-/opt/ultracluster}
CFNCONFIG=${UC_CFNCONFIG:-/etc/parallelcluster/cfnconfig}
MARKER=${STATE_DIR}/on_node_configured.done
IMAGE_MARKER=${STATE_DIR}/neuron-image.done
LOG_TAG=ultracluster-on-node-configured

log() { echo "$(date -u +%FT%TZ) ${LOG_TAG}: $*"; }

pins_digest() {
    printf '%s\n' "${NEURON_RELEASE}" "${NEURON_APT_PACKAGES}" "${BOOTSTRAP_PIP_PACKAGES}" \
        "${NEURON_PIP_PACKAGES}" "${EFA_INSTALLER_VERSION}" | sha256sum | cut -c1-16
}

# What the markers record: the release and a digest of every pin (a changed pin means a new install).
stamp() { echo "neuron=${NEURON_RELEASE} pins=$(pins_digest)"; }

read_marker() { if [[ -r $1 ]]; then head -n1 "$1"; fi; }

write_marker() {
    mkdir -p "$(dirname "$1")"
    echo "$2" > "$1.tmp"
    mv "$1.tmp" "$1"
}

node_type() {
    # ParallelCluster writes cfn_node_type=HeadNode|ComputeFleet|LoginNode here.
    if [[ -r ${CFNCONFIG} ]]; then
        sed -n 's/^cfn_node_type=//p' "${CFNCONFIG}" | head -n1
    else
        echo ComputeFleet
    fi
}

has_neuron_device() {
    compgen -G "/sys/bus/pci/drivers/neuron/*" > /dev/null || lspci -d 1d0f: 2>/dev/null | grep -q .
}

install_neuron_apt_repo() {
    if [[ -s /etc/apt/sources.list.d/neuron.list ]]; then
        return
    fi
    log "adding the Neuron apt repository"
    . /etc/os-release
    install -m 0755 -d /etc/apt/keyrings
    wget -qO - "${NEURON_APT_REPO}/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB" \
        | gpg --batch --yes --dearmor -o /etc/apt/keyrings/neuron.gpg
    echo "deb [signed-by=/etc/apt/keyrings/neuron.gpg] ${NEURON_APT_REPO} ${VERSION_CODENAME} main" \
        > /etc/apt/sources.list.d/neuron.list
}

resolve_apt_spec() {
    # name=UPSTREAM -> name=<the repository's Debian version of exactly UPSTREAM> ("UPSTREAM" or
    # "UPSTREAM-<build>"); fails when the repository has no such build.
    local name=${1%%=*} want=${1#*=} full
    full=$(apt-cache madison "${name}" | awk -v w="${want}" '$3 == w || index($3, w "-") == 1 {print $3; exit}')
    if [[ -z ${full} ]]; then
        # To stderr: the caller captures stdout (the resolved spec).
        log "error: ${name} ${want} (Neuron ${NEURON_RELEASE}) is not in the apt repositories" >&2
        return 1
    fi
    echo "${name}=${full}"
}

install_neuron_driver_runtime_tools() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -y
    # The driver is a DKMS module: it needs the headers of the running kernel. These come from the
    # Ubuntu release's own archive (not versions of the Neuron stack).
    apt-get install -y "linux-headers-$(uname -r)" git
    local spec specs=() names=()
    for spec in ${NEURON_APT_PACKAGES}; do
        specs+=("$(resolve_apt_spec "${spec}")")
        names+=("${spec%%=*}")
    done
    log "installing ${specs[*]}"
    apt-get install -y --allow-downgrades --allow-change-held-packages "${specs[@]}"
    apt-mark hold "${names[@]}"
    echo 'export PATH=/opt/aws/neuron/bin:$PATH' > /etc/profile.d/neuron.sh
}

install_efa_if_missing() {
    if [[ -x /opt/amazon/efa/bin/fi_info ]] && /opt/amazon/efa/bin/fi_info -p efa > /dev/null 2>&1; then
        return
    fi
    log "EFA not found: running the EFA installer ${EFA_INSTALLER_VERSION}"
    local workdir
    workdir=$(mktemp -d)
    curl -fsSL "${EFA_INSTALLER_URL}" -o "${workdir}/efa.tar.gz"
    tar -xzf "${workdir}/efa.tar.gz" -C "${workdir}"
    (cd "${workdir}/aws-efa-installer" && ./efa_installer.sh -y --skip-limit-conf)
    rm -rf "${workdir}"
}

install_neuron_venv() {
    export DEBIAN_FRONTEND=noninteractive
    # Ubuntu's python3 (3.10 on 22.04) and a compiler, from the Ubuntu release's own archive.
    apt-get install -y python3-venv g++
    if [[ ! -x ${NEURON_VENV}/bin/python ]]; then
        log "creating ${NEURON_VENV}"
        python3 -m venv "${NEURON_VENV}"
    fi
    local -a bootstrap packages
    read -r -a bootstrap <<< "${BOOTSTRAP_PIP_PACKAGES}"
    read -r -a packages <<< "${NEURON_PIP_PACKAGES}"
    "${NEURON_VENV}/bin/python" -m pip install "${bootstrap[@]}"
    "${NEURON_VENV}/bin/python" -m pip install --extra-index-url "${NEURON_PIP_REPO}" "${packages[@]}"
    # What pip installed must be what was pinned (a local label such as +0f1dac25 aside).
    "${NEURON_VENV}/bin/python" - "${packages[@]}" <<'EOF'
import sys
from importlib.metadata import version

wrong = []
for spec in sys.argv[1:]:
    name, wanted = spec.split("==")
    got = version(name)
    if got.split("+")[0] != wanted.split("+")[0]:
        wrong.append(f"{name} {got} (pinned {wanted})")
if wrong:
    sys.exit("installed versions differ from the pins: " + ", ".join(wrong))
EOF
    "${NEURON_VENV}/bin/python" -c "import torch_neuronx, torch_xla, transformers, h5py"
}

install_compute_stack() {
    install_neuron_apt_repo
    install_neuron_driver_runtime_tools
    install_efa_if_missing
    install_neuron_venv
}

build_image() {
    # At image build time: the compute stack, then the image marker that lets every compute node
    # booted from the image skip the install.
    if [[ "$(read_marker "${IMAGE_MARKER}")" == "$(stamp)" ]]; then
        log "the image already holds Neuron ${NEURON_RELEASE} with these pins (${IMAGE_MARKER})"
        return
    fi
    log "installing Neuron ${NEURON_RELEASE} into the image"
    install_compute_stack
    write_marker "${IMAGE_MARKER}" "$(stamp)"
    log "image marker ${IMAGE_MARKER}: $(stamp)"
}

main() {
    case "${1:-}" in
        --stamp)
            stamp
            return
            ;;
        --image)
            build_image
            return
            ;;
        "")
            if [[ ! -e ${CFNCONFIG} ]]; then
                # No cluster node (ParallelCluster writes cfnconfig before any custom action runs):
                # a pcluster build-image component, which passes no arguments.
                build_image
                return
            fi
            ;;
        *)
            log "error: unknown argument $1 (none, --image or --stamp)"
            return 2
            ;;
    esac
    local type wanted image
    type=$(node_type)
    wanted="$(stamp) node=${type}"
    if [[ "$(read_marker "${MARKER}")" == "${wanted}" ]]; then
        log "already configured for Neuron ${NEURON_RELEASE} (${MARKER}); nothing to do"
        return
    fi
    log "configuring a ${type} node for Neuron ${NEURON_RELEASE}"
    if [[ ${type} == ComputeFleet ]]; then
        image=$(read_marker "${IMAGE_MARKER}")
        if [[ ${image} == "$(stamp)" ]]; then
            log "the image already holds Neuron ${NEURON_RELEASE} with these pins (${IMAGE_MARKER}); nothing to install"
        elif [[ ${NEURON_INSTALL_AT_BOOT} != true ]]; then
            log "error: the image holds ${image:-no Neuron stack}, pinned is $(stamp), and this cluster does not" \
                "install Neuron at boot (install_neuron_at_boot): run on the node image trn1_build_image builds"
            return 1
        else
            if [[ -n ${image} ]]; then
                log "the image holds ${image}, pinned is $(stamp): installing the pinned stack"
            fi
            install_compute_stack
        fi
        if ! has_neuron_device; then
            log "warning: no Neuron device visible"
        fi
    fi
    write_marker "${MARKER}" "${wanted}"
    log "done: ${wanted}"
}

main "$@"
