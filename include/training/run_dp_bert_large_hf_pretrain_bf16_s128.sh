#!/usr/bin/env bash
# BERT phase-1 pretraining (seq 128), one torchrun per Slurm node:
#   sbatch --exclusive --nodes N --wrap "srun [neuron_parallel_compile] ./run_dp_bert_large_hf_pretrain_bf16_s128.sh"
# Environment contract: docs/contracts.md ("Training job contract") and README.md beside this file.
# Every input is checked before launch; a bad one prints "UC_ERROR <why>" and exits 2.
set -uo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
program="$script_dir/dp_bert_large_hf_pretrain_hdf5.py"
known_model_sizes="large tiny"

fail() {
    echo "UC_ERROR $*"
    exit 2
}

require_positive_int() {  # name value
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || fail "$1 must be a positive integer, got '$2'"
}

# First host of a Slurm node list, for machines without scontrol ("trn1-[3-5],x" -> "trn1-3").
first_host_of_nodelist() {
    local list="$1"
    if [[ "$list" =~ ^([^,\[]+)\[([0-9]+) ]]; then
        echo "${BASH_REMATCH[1]}${BASH_REMATCH[2]}"
    else
        echo "${list%%,*}"
    fi
}

# ---------------------------------------------------------------- Slurm and host facts
node_count="${SLURM_NTASKS:-1}"
node_rank="${SLURM_NODEID:-0}"
job_id="${SLURM_JOB_ID:-manual-$(date +%Y%m%d%H%M%S)}"
require_positive_int SLURM_NTASKS "$node_count"
# One task per node: torchrun starts the workers of a node, not srun.
[[ -z "${SLURM_NNODES:-}" || "$SLURM_NNODES" == "$node_count" ]] \
    || fail "expected one task per node, got SLURM_NTASKS=$node_count on SLURM_NNODES=$SLURM_NNODES nodes"
[[ "$node_rank" =~ ^[0-9]+$ && "$node_rank" -lt "$node_count" ]] \
    || fail "SLURM_NODEID '$node_rank' is not in [0, $node_count)"

# Where the Neuron devices are (tests point it at stand-ins to take the Trn1 path on a CPU machine).
NEURON_DEVICE_GLOB="${NEURON_DEVICE_GLOB:-/dev/neuron*}"
on_trn1=0
if compgen -G "$NEURON_DEVICE_GLOB" >/dev/null; then
    on_trn1=1
fi

# ---------------------------------------------------------------- knobs
MODEL_SIZE="${MODEL_SIZE:-large}"
SCALING_MODE="${SCALING_MODE:-strong}"
MAX_STEPS="${MAX_STEPS:-28125}"
BATCH_SIZE="${BATCH_SIZE:-16}"
GRAD_ACCUM_USTEPS="${GRAD_ACCUM_USTEPS:-32}"
STEPS_THIS_RUN="${STEPS_THIS_RUN:-$MAX_STEPS}"
WARMUP_STEPS="${WARMUP_STEPS:-2000}"
OPTIMIZER="${OPTIMIZER:-adamw}"
SEED="${SEED:-12349}"
STEPS_PER_CKPT="${STEPS_PER_CKPT:-1000}"
NUM_CKPTS_TO_KEEP="${NUM_CKPTS_TO_KEEP:-1}"
SHARDS_PER_CKPT="${SHARDS_PER_CKPT:-0}"
LOG_EVERY="${LOG_EVERY:-1}"
COMPILE_STEPS="${COMPILE_STEPS:-5}"
DATA_DIR="${DATA_DIR:-$HOME/examples_datasets/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128}"
OUTPUT_ROOT="${OUTPUT_ROOT:-$PWD}"
COMPILE_CACHE_DIR="${COMPILE_CACHE_DIR:-$OUTPUT_ROOT/compile_cache}"
TRAINING_PYTHON="${TRAINING_PYTHON:-python3}"
RESUME_DIR="${RESUME_DIR:-}"
RESUME_CKPT="${RESUME_CKPT:-}"
LOCAL_SCRATCH_DIR="${LOCAL_SCRATCH_DIR:-}"

if [[ -z "${NPROC_PER_NODE:-}" ]]; then
    if (( on_trn1 )); then
        # trn1: two NeuronCores per Trainium device (32 on a trn1.32xlarge).
        NPROC_PER_NODE=$(( $(compgen -G "$NEURON_DEVICE_GLOB" | wc -l) * 2 ))
    elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        NPROC_PER_NODE="$(nvidia-smi -L | wc -l)"
    else
        NPROC_PER_NODE=1
    fi
fi

compile_only=0
if [[ -n "${NEURON_EXTRACT_GRAPHS_ONLY:-}" || "${COMPILE_ONLY:-0}" == "1" ]]; then
    compile_only=1
fi

# The Neuron compiler is called by name (neuron_parallel_compile, and torch-neuronx on a device):
# the job's PATH must hold it, and sbatch's PATH (a non-login shell's) does not by itself.
if (( on_trn1 )) || [[ -n "${NEURON_EXTRACT_GRAPHS_ONLY:-}" ]]; then
    command -v neuronx-cc >/dev/null \
        || fail "neuronx-cc not found on the job's PATH ($PATH): put the Neuron venv's bin/ on it"
fi

# ---------------------------------------------------------------- validation (before launch)
[[ " $known_model_sizes " == *" $MODEL_SIZE "* ]] \
    || fail "unknown MODEL_SIZE '$MODEL_SIZE' (known: $known_model_sizes)"
[[ "$SCALING_MODE" == strong || "$SCALING_MODE" == weak ]] \
    || fail "SCALING_MODE must be 'strong' or 'weak', got '$SCALING_MODE'"
[[ "$OPTIMIZER" == adamw || "$OPTIMIZER" == lamb ]] \
    || fail "OPTIMIZER must be 'adamw' or 'lamb', got '$OPTIMIZER'"
for knob in MAX_STEPS BATCH_SIZE GRAD_ACCUM_USTEPS STEPS_THIS_RUN STEPS_PER_CKPT \
            NUM_CKPTS_TO_KEEP LOG_EVERY COMPILE_STEPS NPROC_PER_NODE; do
    require_positive_int "$knob" "${!knob}"
done
[[ "$WARMUP_STEPS" =~ ^[0-9]+$ ]] || fail "WARMUP_STEPS must be an integer >= 0, got '$WARMUP_STEPS'"
[[ "$SHARDS_PER_CKPT" =~ ^[0-9]+$ ]] || fail "SHARDS_PER_CKPT must be an integer >= 0"

[[ -d "$DATA_DIR" ]] || fail "DATA_DIR '$DATA_DIR' does not exist"
shopt -s nullglob
training_files=("$DATA_DIR"/*_training_*.hdf5)
shopt -u nullglob
(( ${#training_files[@]} > 0 )) || fail "DATA_DIR '$DATA_DIR' holds no *_training_*.hdf5 files"
world_size=$(( node_count * NPROC_PER_NODE ))
(( world_size <= ${#training_files[@]} )) \
    || fail "world size $world_size ($node_count nodes x $NPROC_PER_NODE workers) exceeds the" \
            "${#training_files[@]} training files in '$DATA_DIR': every worker needs its own file"

grad_accum="$GRAD_ACCUM_USTEPS"
if [[ "$SCALING_MODE" == strong ]]; then
    # Strong scaling keeps the global batch: the nodes share the accumulation micro-steps.
    (( node_count <= GRAD_ACCUM_USTEPS )) \
        || fail "strong scaling: $node_count nodes would leave 0 of GRAD_ACCUM_USTEPS=$GRAD_ACCUM_USTEPS" \
                "micro-steps per node; use at most $GRAD_ACCUM_USTEPS nodes or SCALING_MODE=weak"
    (( GRAD_ACCUM_USTEPS % node_count == 0 )) \
        || fail "strong scaling: GRAD_ACCUM_USTEPS=$GRAD_ACCUM_USTEPS is not divisible by" \
                "$node_count nodes, so the global batch would change; use a node count that" \
                "divides $GRAD_ACCUM_USTEPS or SCALING_MODE=weak"
    grad_accum=$(( GRAD_ACCUM_USTEPS / node_count ))
fi
global_batch=$(( BATCH_SIZE * grad_accum * world_size ))

command -v "$TRAINING_PYTHON" >/dev/null || fail "TRAINING_PYTHON '$TRAINING_PYTHON' not found"
[[ -z "$RESUME_DIR" || -d "$RESUME_DIR" ]] || fail "RESUME_DIR '$RESUME_DIR' does not exist"
[[ -z "$RESUME_CKPT" || -f "$RESUME_CKPT" ]] || fail "RESUME_CKPT '$RESUME_CKPT' is not a file"

if [[ -n "${MASTER_ADDR:-}" ]]; then
    master_addr="$MASTER_ADDR"
elif [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then
    if command -v scontrol >/dev/null; then
        master_addr="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
    else
        master_addr="$(first_host_of_nodelist "$SLURM_JOB_NODELIST")"
    fi
else
    master_addr=127.0.0.1
fi
# torchrun waits forever on a master it cannot resolve: refuse it here instead.
if [[ "$master_addr" =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
    master_ip="$master_addr"
else
    master_ip="$(getent hosts "$master_addr" | awk 'NR == 1 {print $1}')"
fi
[[ -n "$master_ip" ]] || fail "master host '$master_addr' does not resolve"
if [[ -z "${MASTER_PORT:-}" ]]; then
    if (( on_trn1 )); then
        MASTER_PORT=2022
    else
        # Local clusters share one network stack, and every one of them names its nodes alike
        # and counts jobs from 1; the rendezvous listens on all addresses. So a port per (master
        # IP, job), above the ephemeral range and away from the local clusters' Slurm ports
        # (20000+). A master 127.x.S.y (S: its local cluster's slot) gets a block of 17 ports no
        # other cluster uses, so clusters running at once never collide.
        job_hash=$(printf '%s' "$job_id" | cksum | cut -d' ' -f1)
        if [[ "$master_ip" =~ ^127\.[0-9]+\.([0-9]+)\.[0-9]+$ ]]; then
            MASTER_PORT=$(( 61000 + BASH_REMATCH[1] * 17 + job_hash % 17 ))
        else
            MASTER_PORT=$(( 61000 + $(printf '%s' "$master_ip:$job_id" | cksum | cut -d' ' -f1) % 4500 ))
        fi
    fi
fi

# Reserved so that no ephemeral port takes it: the port the Neuron sample's run script reserves
# for the Neuron runtime's collectives. Added to what the node already reserves.
NEURON_RESERVED_PORT=48620
reserve_neuron_port() {
    local current
    current="$(sysctl -n net.ipv4.ip_local_reserved_ports 2>/dev/null)" \
        || fail "cannot read net.ipv4.ip_local_reserved_ports on $(hostname)"
    [[ ",${current// /}," == *",$NEURON_RESERVED_PORT,"* ]] && return 0
    local wanted="${current:+$current,}$NEURON_RESERVED_PORT"
    if (( EUID == 0 )); then
        sysctl -q -w "net.ipv4.ip_local_reserved_ports=$wanted" >/dev/null 2>&1
    else
        sudo -n sysctl -q -w "net.ipv4.ip_local_reserved_ports=$wanted" >/dev/null 2>&1
    fi || fail "cannot reserve local port $NEURON_RESERVED_PORT on $(hostname):" \
               "'sysctl -w net.ipv4.ip_local_reserved_ports=$wanted' needs root (or passwordless sudo" \
               "for sysctl); reserve it in the node's set-up instead"
}

(( on_trn1 )) && reserve_neuron_port

# ---------------------------------------------------------------- environment
output_dir="$OUTPUT_ROOT/output_$job_id"
mkdir -p "$output_dir" "$COMPILE_CACHE_DIR" || fail "cannot create '$output_dir' or '$COMPILE_CACHE_DIR'"
log_file="$output_dir/log_ph1_bf16_${node_rank}_${node_count}"

# Node-local scratch (a compute node's NVMe): temporary files and compiler work directories go to a
# directory per job and node there, when the node has it; the compile cache stays on shared storage.
# Named but missing (no EphemeralVolume mounted): an error, not a quiet fall back to the small root volume.
scratch_dir=""
if [[ -n "$LOCAL_SCRATCH_DIR" ]]; then
    [[ -d "$LOCAL_SCRATCH_DIR" && -w "$LOCAL_SCRATCH_DIR" ]] \
        || fail "LOCAL_SCRATCH_DIR '$LOCAL_SCRATCH_DIR' is not a writable directory on $(hostname) (is the node's EphemeralVolume mounted?)"
    scratch_dir="$LOCAL_SCRATCH_DIR/ultracluster-${job_id}-${node_rank}"
    mkdir -p "$scratch_dir/tmp" || fail "cannot create '$scratch_dir/tmp' in LOCAL_SCRATCH_DIR"
    export TMPDIR="$scratch_dir/tmp"
fi

if (( on_trn1 )); then
    export FI_PROVIDER=efa FI_EFA_USE_DEVICE_RDMA=1 FI_EFA_FORK_SAFE=1
    # One cache on shared storage: the compile job fills it, every node of the run reuses it.
    export NEURON_COMPILE_CACHE_URL="$COMPILE_CACHE_DIR"
    # A graph whose compilation failed (or was interrupted) is cached as failed and skipped by every
    # later run unless --retry_failed_compilation (parsed by torch-neuronx's compiler wrapper).
    # The user's flags (extra_job_env) come after ours: they add, and a repeated flag overrides.
    export NEURON_CC_FLAGS="--model-type transformer --retry_failed_compilation${NEURON_CC_FLAGS:+ $NEURON_CC_FLAGS}"
    export NEURON_RT_STOCHASTIC_ROUNDING_EN=1 MALLOC_ARENA_MAX=64
    # The sample's multi-node settings: runtime execution time-out, gradient bucket size, async seeds.
    export NEURON_RT_EXEC_TIMEOUT=600 BUCKET_CAP_MB=512 XLA_TRANSFER_SEED_ASYNC=1
else
    export TORCHINDUCTOR_CACHE_DIR="$COMPILE_CACHE_DIR/inductor"
fi

steps_this_run="$STEPS_THIS_RUN"
extra_args=()
if (( compile_only )); then
    steps_this_run="$COMPILE_STEPS"
    extra_args+=(--compile_only)
fi
[[ -n "$RESUME_DIR" ]] && extra_args+=(--resume_dir "$RESUME_DIR")
# Compile-only jobs never load a checkpoint: RESUME_CKPT is for the training job only.
(( compile_only )) || { [[ -n "$RESUME_CKPT" ]] && extra_args+=(--resume_ckpt "$RESUME_CKPT"); }
[[ -n "${LR:-}" ]] && extra_args+=(--lr "$LR")
[[ -n "${TORCH_NUM_THREADS:-}" ]] && extra_args+=(--num_threads "$TORCH_NUM_THREADS")
[[ -n "${TORCH_COMPILE:-}" ]] && extra_args+=(--torch_compile "$TORCH_COMPILE")

echo "UC_INFO node=$node_rank/$node_count host=$(hostname) master=$master_addr:$MASTER_PORT" \
     "model=$MODEL_SIZE scaling_mode=$SCALING_MODE workers_per_node=$NPROC_PER_NODE" \
     "grad_accum_usteps=$grad_accum global_batch=$global_batch compile_only=$compile_only" \
     "output_dir=$output_dir scratch=${scratch_dir:-none}"

launch=(
    "$TRAINING_PYTHON" -m torch.distributed.run
    --nproc_per_node "$NPROC_PER_NODE" --nnodes "$node_count" --node_rank "$node_rank"
    --master_addr "$master_addr" --master_port "$MASTER_PORT"
    "$program"
    --data_dir "$DATA_DIR"
    --output_dir "$output_dir"
    --metrics_file "$output_dir/results.json"
    --model_size "$MODEL_SIZE"
    --max_steps "$MAX_STEPS"
    --steps_this_run "$steps_this_run"
    --batch_size "$BATCH_SIZE"
    --grad_accum_usteps "$grad_accum"
    --warmup_steps "$WARMUP_STEPS"
    --optimizer "$OPTIMIZER"
    --seed "$SEED"
    --max_pred_len 20
    --steps_per_ckpt "$STEPS_PER_CKPT"
    --num_ckpts_to_keep "$NUM_CKPTS_TO_KEEP"
    --shards_per_ckpt "$SHARDS_PER_CKPT"
    --log_every "$LOG_EVERY"
    --compile_cache_dir "$COMPILE_CACHE_DIR"
    --scaling_mode "$SCALING_MODE"
    --num_nodes "$node_count"
    "${extra_args[@]}"
)

# A cancelled job's step gets SIGTERM (SIGKILL KillWait later). Untrapped, bash dies at once and the
# orphaned torchrun escapes the step's process tracking (proctrack/linuxproc) and outlives the job; so
# pass the signal on to the launcher and wait for it: the step ends when its processes have.
launcher_pid=""
stop_launcher() {
    echo "UC_INFO node=$node_rank got SIGTERM: stopping the launcher" >&2
    [[ -n "$launcher_pid" ]] && kill -TERM "$launcher_pid" 2>/dev/null
}
trap stop_launcher TERM INT
# Node 0 (rank 0: progress and results lines) also writes to the Slurm log; the others only
# to their own log file, so the Slurm log stays readable. tee ignores SIGTERM so that it keeps the
# launcher's last lines and ends at their EOF.
if (( node_rank == 0 )); then
    "${launch[@]}" > >(trap '' TERM; exec tee "$log_file") 2>&1 &
else
    "${launch[@]}" > "$log_file" 2>&1 &
fi
launcher_pid=$!
while :; do
    wait "$launcher_pid"
    status=$?
    # > 128: the trap interrupted the wait, and the launcher may still be stopping.
    (( status > 128 )) && kill -0 "$launcher_pid" 2>/dev/null || break
done
wait  # node 0's tee, until the launcher's last line is in the log
(( status == 0 || node_rank == 0 )) || echo "node $node_rank failed with status $status: see $log_file" >&2
# A job that succeeded leaves no scratch behind (static nodes live on); a failed one keeps it, with
# the compiler's work files, until the node's instance store goes with the instance.
if (( status == 0 )) && [[ -n "$scratch_dir" ]]; then
    rm -rf "$scratch_dir"
fi
exit "$status"
