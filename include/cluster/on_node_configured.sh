#!/bin/bash
# ParallelCluster OnNodeConfigured action for Trn1 nodes on Ubuntu 20.04 / 22.04 / 24.04
# (Image.Os ubuntu2004 as in the blog; ubuntu2204/2404 for ParallelCluster >= 3.14).
#
# render_config uploads this file to the artifacts bucket and references it from the head node and
# every queue. It runs as root once a node is configured, on every node that boots (dynamic nodes
# included), so it must be idempotent: each step checks what is already there, and a marker records
# the versions a node finished with.
#
# What it installs on Trn1/Trn1n compute nodes:
#   1. the Neuron apt repository (signed-by keyring), the Neuron driver (aws-neuronx-dkms),
#      runtime + collectives (aws-neuronx-runtime-lib, aws-neuronx-collectives) and tools
#      (aws-neuronx-tools: neuron-top, neuron-ls);
#   2. EFA (the ParallelCluster AMI ships it when Efa.Enabled; the installer runs only if missing);
#   3. the Neuron PyTorch venv at $NEURON_VENV: torch-neuronx, neuronx-cc, transformers, h5py
#      (training_python in the production profile points at $NEURON_VENV/bin/python).
# The head node (no Neuron device, runs no training) gets nothing but the marker.
#
# Versions are pinned by the variables below; override them by editing the uploaded copy, not here.
# A non-zero exit makes ParallelCluster report OnNodeConfiguredExecutionFailure for the node.
set -euo pipefail

NEURON_VENV=/opt/aws_neuron_venv_pytorch
NEURON_APT_REPO=https://apt.repos.neuron.amazonaws.com
NEURON_PIP_REPO=https://pip.repos.neuron.amazonaws.com
NEURON_APT_PACKAGES="aws-neuronx-dkms=2.* aws-neuronx-runtime-lib=2.* aws-neuronx-collectives=2.* aws-neuronx-tools=2.*"
NEURON_PIP_PACKAGES="neuronx-cc==2.* torch-neuronx==2.* transformers==4.* h5py"
EFA_INSTALLER_URL=https://efa-installer.amazonaws.com/aws-efa-installer-latest.tar.gz
MARKER=/opt/ultracluster/on_node_configured.done
LOG_TAG=ultracluster-on-node-configured

log() { echo "$(date -u +%FT%TZ) ${LOG_TAG}: $*"; }

node_type() {
    # ParallelCluster writes cfn_node_type=HeadNode|ComputeFleet|LoginNode here.
    local cfnconfig=/etc/parallelcluster/cfnconfig
    if [[ -r ${cfnconfig} ]]; then
        sed -n 's/^cfn_node_type=//p' "${cfnconfig}" | head -n1
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

install_neuron_driver_runtime_tools() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -y
    # The driver is a DKMS module: it needs headers of the running kernel.
    apt-get install -y "linux-headers-$(uname -r)" git
    # shellcheck disable=SC2086  # word splitting wanted: one package per word
    apt-get install -y --allow-change-held-packages ${NEURON_APT_PACKAGES}
    echo 'export PATH=/opt/aws/neuron/bin:$PATH' > /etc/profile.d/neuron.sh
}

install_efa_if_missing() {
    if [[ -x /opt/amazon/efa/bin/fi_info ]] && /opt/amazon/efa/bin/fi_info -p efa > /dev/null 2>&1; then
        return
    fi
    log "EFA not found: running the EFA installer"
    local workdir
    workdir=$(mktemp -d)
    curl -fsSL "${EFA_INSTALLER_URL}" -o "${workdir}/efa.tar.gz"
    tar -xzf "${workdir}/efa.tar.gz" -C "${workdir}"
    (cd "${workdir}/aws-efa-installer" && ./efa_installer.sh -y --skip-limit-conf)
    rm -rf "${workdir}"
}

install_neuron_venv() {
    export DEBIAN_FRONTEND=noninteractive
    # The distribution's python3: 3.8 on 20.04, 3.10 on 22.04, 3.12 on 24.04 (all supported by Neuron).
    apt-get install -y python3-venv g++
    if [[ ! -x ${NEURON_VENV}/bin/python ]]; then
        log "creating ${NEURON_VENV}"
        python3 -m venv "${NEURON_VENV}"
    fi
    "${NEURON_VENV}/bin/python" -m pip install -U pip
    # shellcheck disable=SC2086
    "${NEURON_VENV}/bin/python" -m pip install --extra-index-url "${NEURON_PIP_REPO}" ${NEURON_PIP_PACKAGES}
    "${NEURON_VENV}/bin/python" -c "import torch_neuronx, transformers, h5py"
}

main() {
    local type
    type=$(node_type)
    local wanted="${type} ${NEURON_APT_PACKAGES} ${NEURON_PIP_PACKAGES}"
    if [[ -f ${MARKER} ]] && [[ "$(cat "${MARKER}")" == "${wanted}" ]]; then
        log "already configured (${MARKER}); nothing to do"
        return
    fi
    log "configuring a ${type} node"
    if [[ ${type} == ComputeFleet ]]; then
        install_neuron_apt_repo
        install_neuron_driver_runtime_tools
        install_efa_if_missing
        if ! has_neuron_device; then
            log "warning: no Neuron device visible; driver installed anyway"
        fi
        install_neuron_venv
    fi
    mkdir -p "$(dirname "${MARKER}")"
    echo "${wanted}" > "${MARKER}"
    log "done"
}

main "$@"
