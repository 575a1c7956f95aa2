#!/usr/bin/env bash
# The node health gate: the train job's first step, one task per node
#   (srun --ntasks-per-node=1 node_health.sh, from the job's wrap: plugins/ultracluster/remote_commands/slurm.py).
# Counts this node's Neuron devices (neuron-ls --json-output) and EFA devices (the distinct domains of
# fi_info -p efa -t FI_EP_RDM), prints one line
#   UC_HEALTH {"node": ..., "instance_type": ..., "healthy": true|false, "checks": {"neuron": {...}, "efa": {...}}}
# and exits 1 when a count is below what the instance type has. The gate's third check, an all-reduce
# across the nodes, is the training program's start-up collective check (pretrain_runtime.py).
# Expectations come from the pipeline (plugins/ultracluster/run/health.py):
#   UC_HEALTH_INSTANCE_TYPE, UC_HEALTH_NEURON_DEVICES, UC_HEALTH_EFA_DEVICES (0: the check is skipped).
# The tools are called at their real paths (the job's PATH need not hold them); tests point
# UC_HEALTH_NEURON_LS / UC_HEALTH_FI_INFO at stand-ins.
set -uo pipefail

NEURON_LS="${UC_HEALTH_NEURON_LS:-/opt/aws/neuron/bin/neuron-ls}"
FI_INFO="${UC_HEALTH_FI_INFO:-/opt/amazon/efa/bin/fi_info}"
TOOL_TIMEOUT_S="${UC_HEALTH_TOOL_TIMEOUT_S:-60}"
node="${SLURMD_NODENAME:-$(hostname -s)}"

usage_error() {
    echo "node_health.sh on $node: $*" >&2
    exit 2
}

for knob in UC_HEALTH_NEURON_DEVICES UC_HEALTH_EFA_DEVICES; do
    [[ "${!knob:-}" =~ ^[0-9]+$ ]] || usage_error "$knob must be an integer >= 0, got '${!knob:-}'"
done
[[ -n "${UC_HEALTH_INSTANCE_TYPE:-}" ]] || usage_error "UC_HEALTH_INSTANCE_TYPE is not set"

# A JSON string: backslashes and quotes escaped, control characters (newlines too) made spaces.
json_string() {
    local text
    text="$(printf '%s' "$1" | tr '\000-\037' ' ')"
    text="${text//\\/\\\\}"
    printf '"%s"' "${text//\"/\\\"}"
}

# Runs a tool with a time-out. Sets tool_out (stdout) and tool_error (empty when it succeeded).
run_tool() {
    local errors rc
    errors="$(mktemp)"
    tool_error=""
    if [[ ! -x "$1" ]]; then
        tool_out="" tool_error="$1 not found"
        rm -f "$errors"
        return
    fi
    tool_out="$(timeout "$TOOL_TIMEOUT_S" "$@" 2>"$errors")"
    rc=$?
    if (( rc == 124 )); then
        tool_error="$* timed out after ${TOOL_TIMEOUT_S} s"
    elif (( rc != 0 )); then
        tool_error="$* exited $rc: $(tail -n 3 "$errors")"
    fi
    rm -f "$errors"
}

healthy=true
# One check as JSON, and the node's verdict: unhealthy when the tool failed or found too few devices.
check_json() {  # expected found error
    if [[ -n "$3" ]]; then
        healthy=false
        check="$(printf '{"expected": %d, "found": null, "error": %s}' "$1" "$(json_string "$3")")"
        return
    fi
    (( $2 < $1 )) && healthy=false
    check="$(printf '{"expected": %d, "found": %d}' "$1" "$2")"
}

# Neuron devices: neuron-ls --json-output lists one object per device (aws-neuronx-tools 2.28).
neuron_found=0
run_tool "$NEURON_LS" --json-output
if [[ -z "$tool_error" ]]; then
    neuron_found="$(grep -o '"neuron_device"' <<<"$tool_out" | wc -l)"
fi
check_json "$UC_HEALTH_NEURON_DEVICES" "$neuron_found" "$tool_error"
neuron="$check"

# EFA devices: fi_info lists each endpoint the provider offers; a device is a domain (rdmapXsY-rdm).
if (( UC_HEALTH_EFA_DEVICES == 0 )); then
    efa='{"expected": 0, "found": null}'
else
    efa_found=0
    run_tool "$FI_INFO" -p efa -t FI_EP_RDM
    if [[ -z "$tool_error" ]]; then
        efa_found="$(awk '$1 == "domain:" {print $2}' <<<"$tool_out" | sort -u | wc -l)"
    fi
    check_json "$UC_HEALTH_EFA_DEVICES" "$efa_found" "$tool_error"
    efa="$check"
fi

echo "UC_HEALTH {\"node\": $(json_string "$node"), \"instance_type\": $(json_string "$UC_HEALTH_INSTANCE_TYPE"), \"healthy\": $healthy, \"checks\": {\"neuron\": $neuron, \"efa\": $efa}}"
[[ "$healthy" == true ]]
