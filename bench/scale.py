"""Benchmark 8, scale rehearsal: the orchestration at real node counts on the local UltraCluster.

One queue of N dynamic nodes (2 = the baseline, then 16, 32, 64), one cluster at a time, each
phase run with the product's own code, in process:
  create          ParallelClusterHook.create_cluster, then ClusterStatusTrigger (ClusterCreateComplete)
  wait_for_fleet  ComputeFleetTrigger for num_nodes = N
  job             SlurmHook.sbatch of `srun job.sh` on all N nodes (each task writes its per-node log;
                  rank 0 gathers them over /fsx), waited with SlurmJobTrigger; submit -> event
  collect         CollectResultsOperator.execute: results.json, every node's log, to S3 (moto)
  delete          ParallelClusterHook.delete_cluster, then ClusterStatusTrigger (ClusterDeleteComplete)
Per phase and N: wall time, SSH connections and remote commands (counted by wrapping the SSH client
calls the hooks make: paramiko connect/exec_command/open_sftp, asyncssh connect/get_server_host_key/
create_session), pcluster CLI invocations (ParallelClusterHook._run/_arun), memory (RSS of the
cluster's processes read from /proc, and the machine's used-memory delta). Growth is reported against
N = 2. The parse of the real sinfo/squeue/listing output at each N is timed too (product parsers).
Finally the ceiling: one cluster of --ceiling nodes (89, the most a slot holds) runs the light job.
The counting, memory and parse probes live in bench/_scale_measure.py.

Own LOCAL_ULTRACLUSTER_HOME under /tmp/uc-bench-scale-*, own moto, slots 120-127; all torn down.
Each N runs once, then the ceiling, then repetitions 2 and 3 of each N while they fit in --budget-s
(the whole benchmark about 8 minutes); the results say how many each N got.
Run: .venvs/airflow/bin/python bench/scale.py [--nodes 2,16,32,64] [--reps 3] [--ceiling 89] [--budget-s 470]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import REPO, Report, summary  # noqa: E402
from _scale_measure import Calls, cluster_rss, nodes_logged, time_parsers, used_memory_mib  # noqa: E402

sys.path.insert(0, str(REPO / "plugins"))
LC_BIN = REPO / ".venvs" / "localcluster" / "bin"
SLOTS = {"LOCAL_UC_SLOT_MIN": "120", "LOCAL_UC_SLOT_MAX": "127", "LOCAL_UC_PORT_BASE": "4000",
         "LOCAL_UC_DB_PORT": "4091", "LOCAL_UC_PROVISIONING_DELAY": "0"}
PROFILE = json.loads((REPO / "include" / "profiles" / "local.json").read_text())
PHASES = ("create", "wait_for_fleet", "job", "collect", "delete")
JOB_DIR = "/fsx/jobs/scale"

# Each task writes its node's log; rank 0 waits until every node's log is on /fsx (a gather over the
# shared file system, so all N tasks really ran), then writes results.json.
JOB_SCRIPT = r"""#!/bin/bash
set -u
out="$JOB_DIR/output_$SLURM_JOB_ID"
mkdir -p "$out"
echo "rank $SLURM_PROCID of $SLURM_NNODES on $(hostname) at $(date +%s.%N)" > "$out/log_ph1_bf16_${SLURM_PROCID}_${SLURM_NNODES}"
if [ "$SLURM_PROCID" = 0 ]; then
  for _ in $(seq 600); do
    n=$(ls "$out" | grep -c '^log_ph1_bf16_')
    [ "$n" -ge "$SLURM_NNODES" ] && break
    sleep 0.1
  done
  hosts=$(cat "$out"/log_ph1_bf16_* | awk '{print $6}' | sort -u | wc -l)
  cat > "$out/results.json" <<EOF
{"results": {"parameters": {"World size": $SLURM_NNODES, "Nodes": $SLURM_NNODES, "Batch size": 1,
 "Gradient accumulation microsteps": 1, "Total steps": 1, "Distinct hosts": $hosts},
 "metrics": [{"MetricName": "Final loss", "MeasuredValue": 0.0, "Units": "-", "Timestamp": "t", "AdditionalData": ""}]}}
EOF
  echo "UC_RESULTS $out/results.json"
fi
"""


# ------------------------------------------------------------------------------- set-up

def free_port(start: int = 4092, end: int = 4099) -> int:
    for port in range(start, end + 1):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{end} for moto")


def admin(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(LC_BIN / "local-ultracluster"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def set_connections(home: Path, endpoint: str) -> None:
    """The three Airflow connections as `local-ultracluster up` writes them (airflow.env), for this process."""
    cli_env = {"AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "LOCAL_ULTRACLUSTER_HOME": str(home), **SLOTS}
    os.environ["AIRFLOW_CONN_PCLUSTER_DEFAULT"] = json.dumps(
        {"conn_type": "pcluster", "extra": {"binary": str(LC_BIN / "pcluster"), "region": "us-east-1", "env": cli_env}})
    os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(
        {"conn_type": "aws", "login": "testing", "password": "testing",
         "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}})
    os.environ["AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE"] = json.dumps(
        {"conn_type": "ssh", "login": "ubuntu",  # Image.Os ubuntu2204's default user
         "port": int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
         "extra": {"key_file": str(home / "keys" / "ultracluster-local")}})


def make_subnet(endpoint: str) -> str:
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    return ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]


def write_config(home: Path, subnet: str, nodes: int, name: str) -> Path:
    """A minimal valid ParallelCluster v3 config (tests' cluster_config shape): one queue, N dynamic nodes."""
    import yaml

    config = {
        "Region": "us-east-1", "Image": {"Os": "ubuntu2204"},
        "HeadNode": {"InstanceType": "c5.4xlarge", "Networking": {"SubnetId": subnet},
                     "Ssh": {"KeyName": "ultracluster-local"}},
        "Scheduling": {"Scheduler": "slurm", "SlurmSettings": {"ScaledownIdletime": 10}, "SlurmQueues": [
            {"Name": "compute1", "CapacityType": "ONDEMAND",
             "Networking": {"SubnetIds": [subnet], "PlacementGroup": {"Enabled": True}},
             "ComputeResources": [{"Name": "trn1", "InstanceType": "trn1.32xlarge", "MinCount": 0,
                                   "MaxCount": nodes, "Efa": {"Enabled": True}}]}]},
        "SharedStorage": [{"MountDir": "/fsx", "Name": "fsx", "StorageType": "FsxLustre",
                           "FsxLustreSettings": {"StorageCapacity": 1200, "DeploymentType": "SCRATCH_2"}}],
    }
    path = home / "configs" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def first_event(trigger, timeout: float) -> dict:
    async def first():
        async for event in trigger.run():
            return event.payload
    return await asyncio.wait_for(first(), timeout)


def context(run_id: str) -> dict:
    class Outlets(dict):
        def __missing__(self, key):
            self[key] = SimpleNamespace(extra={})
            return self[key]
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=run_id, task_id="collect_results", map_index=-1,
                         xcom_push=lambda **_: None)
    return {"ti": ti, "outlet_events": Outlets()}


def slurm_time(value: str | None) -> float | None:
    try:
        return datetime.fromisoformat(value).timestamp() if value else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------- one cluster

def rehearse(nodes: int, rep: int, home: Path, subnet: str, calls: Calls, script: Path) -> dict:
    """Run the five phases on a fresh cluster of ``nodes`` dynamic nodes; returns the measurements."""
    from ultracluster import remote_commands as rc
    from ultracluster.hooks.parallelcluster import ParallelClusterHook
    from ultracluster.hooks.slurm import SlurmHook
    from ultracluster.operators.results import CollectResultsOperator
    from ultracluster.parsers import slurm as parse_slurm
    from ultracluster.triggers.fleet import ComputeFleetTrigger
    from ultracluster.triggers.pcluster import ClusterStatusTrigger
    from ultracluster.triggers.slurm import SlurmJobTrigger

    name = f"scale{nodes}r{rep}"
    hook = ParallelClusterHook()
    out: dict = {"nodes": nodes, "phases": {}, "ok": False}
    state: dict = {}
    base_used = used_memory_mib()

    def phase(label, body):
        before, start = calls.snapshot(), time.monotonic()
        result = body()
        wall = time.monotonic() - start
        delta = calls.snapshot() - before
        out["phases"][label] = {"wall_s": wall, **{k: delta.get(k, 0) for k in
                                ("ssh_connections", "remote_commands", "sftp_sessions", "pcluster_cli", "aws_api")}}
        print(f"  {name} {label}: {wall:.2f} s {dict(delta)}", flush=True)
        return result

    def create():
        hook.create_cluster(name, str(write_config(home, subnet, nodes, name)))
        event = asyncio.run(first_event(ClusterStatusTrigger(
            cluster_name=name, waiter_name="ClusterCreateComplete",
            poll_interval=PROFILE["cluster_poll_interval_s"]), 600))
        if event["status"] != "success":
            raise RuntimeError(f"create {name}: {event}")

    def fleet():
        event = asyncio.run(first_event(ComputeFleetTrigger(
            cluster_name=name, num_nodes=nodes, partition=None, pcluster_conn_id="pcluster_default",
            ssh_conn_id="ultracluster_head_node", ssh_port=int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
            poke_interval=PROFILE["fleet_poke_interval_s"]), 300))
        if event["status"] != "success":
            raise RuntimeError(f"wait_for_fleet {name}: {event}")
        state["head"] = event["head_node"]

    def job():
        slurm = SlurmHook(head_node=state["head"])
        slurm.head_node_hook.check(rc.make_dirs(JOB_DIR))
        slurm.head_node_hook.put_file(str(script), f"{JOB_DIR}/job.sh", mode=0o755)
        state["submitted"] = time.time()
        job_id = slurm.sbatch(job_dir=JOB_DIR, script_path=f"{JOB_DIR}/job.sh", num_nodes=nodes,
                              job_name=f"uc.scale.{nodes}", comment="scale rehearsal", job_env={"JOB_DIR": JOB_DIR},
                              partition=state["head"].get("partition"))
        log_path = rc.job_file(JOB_DIR, job_id, "out")
        event = asyncio.run(first_event(SlurmJobTrigger(
            head_node=state["head"], ssh_conn_id="ultracluster_head_node", job_id=job_id, job_dir=JOB_DIR,
            log_path=log_path, poll_interval=PROFILE["job_poll_interval_s"], progress_log_interval_s=0), 600))
        state["event_at"] = time.time()
        if event.get("state") != "COMPLETED":
            raise RuntimeError(f"job on {nodes} nodes: {event}")
        state["train"] = {"job_id": job_id, "output_dir": f"{JOB_DIR}/output_{job_id}", "log_path": log_path,
                          "results_path": f"{JOB_DIR}/output_{job_id}/results.json"}

    def collect():
        operator = CollectResultsOperator(task_id="collect_results", head_node=state["head"], train=state["train"],
                                          artifacts_s3_uri="s3://ultracluster-artifacts/scale", num_nodes=nodes)
        state["metrics"] = operator.execute(context(f"manual__{name}"))

    def delete():
        hook.delete_cluster(name)
        event = asyncio.run(first_event(ClusterStatusTrigger(
            cluster_name=name, waiter_name="ClusterDeleteComplete",
            poll_interval=PROFILE["cluster_poll_interval_s"]), 600))
        if event["status"] != "success":
            raise RuntimeError(f"delete {name}: {event}")

    try:
        phase("create", create)
        out["rss_created_mib"] = cluster_rss(home)
        phase("wait_for_fleet", fleet)
        phase("job", job)
        # Measured while every node is still up (they idle until ScaledownIdletime).
        out["rss_job_mib"] = cluster_rss(home)
        out["used_delta_mib"] = used_memory_mib() - base_used
        slurm = SlurmHook(head_node=state["head"])
        info = parse_slurm.parse_scontrol_show_job(
            slurm.head_node_hook.check(rc.scontrol_show_job(state["train"]["job_id"])).stdout)
        start, end = slurm_time(info.raw.get("StartTime")), slurm_time(info.raw.get("EndTime"))
        out["slurm"] = {"queued_s": start - state["submitted"] if start else None,
                        "run_s": end - start if start and end else None,
                        "end_to_event_s": state["event_at"] - end if end else None,
                        "num_nodes": info.num_nodes}
        out["parse_us"] = time_parsers(slurm, state["train"])
        phase("collect", collect)
        out["collected_logs"] = nodes_logged(state["train"], nodes)
        out["ok"] = True
    finally:
        with contextlib.suppress(Exception):
            phase("delete", delete)
    return out


# ------------------------------------------------------------------------------- report

def report(results: list[dict], ceiling: dict | None, reps: dict[int, int]) -> None:
    rep = Report("scale", "8. Scale rehearsal (local UltraCluster, N dynamic nodes; growth against N = 2)")
    ok = [r for r in results if r["ok"]]
    by_n: dict[int, list[dict]] = defaultdict(list)
    for r in ok:
        by_n[r["nodes"]].append(r)
    if 2 not in by_n:
        raise SystemExit("scale: the 2-node baseline failed; no ratios")

    def med(n, get):
        values = [v for v in (get(r) for r in by_n[n]) if v is not None]
        return summary(values) if values else None

    base = {p: med(2, lambda r, p=p: r["phases"].get(p, {}).get("wall_s"))["median"] for p in PHASES}
    for n in sorted(by_n):
        note = f"{len(by_n[n])} rep(s)"
        for p in PHASES:
            s = med(n, lambda r, p=p: r["phases"].get(p, {}).get("wall_s"))
            if not s:
                continue
            rep.figure(f"N={n} {p} wall time", s, "s", note=note)
            if n != 2:
                rep.figure(f"N={n} {p} time / N=2 time", s["median"] / base[p], "x",
                           note=f"node ratio {n / 2:g}; per-node growth {s['median'] / base[p] / (n / 2):.3g}")
            counts = by_n[n][0]["phases"][p]
            for k in ("ssh_connections", "remote_commands", "pcluster_cli", "aws_api"):
                rep.figure(f"N={n} {p} {k.replace('_', ' ')}", float(counts[k]), "calls")
        slurm = med(n, lambda r: r["slurm"]["run_s"])
        if slurm:
            rep.figure(f"N={n} job: Slurm start to end", slurm, "s", note="Slurm's StartTime/EndTime (1 s resolution)")
        queued = med(n, lambda r: r["slurm"]["queued_s"])
        if queued:
            rep.figure(f"N={n} job: submit to Slurm start", queued, "s", note="nodes power up (boot + CONFIGURING)")
        latency = med(n, lambda r: r["slurm"]["end_to_event_s"])
        if latency:
            rep.figure(f"N={n} job: Slurm end to trigger event", latency, "s", note="EndTime has 1 s resolution")
        rss = by_n[n][0]["rss_job_mib"]
        daemons = {k: v for k, v in rss.items() if k not in ("moto", "python")}
        rep.figure(f"N={n} cluster daemons RSS, all nodes up", sum(daemons.values()), "MiB",
                   note=", ".join(f"{k} {v:.0f}" for k, v in sorted(daemons.items(), key=lambda kv: -kv[1])[:6])
                   + f"; moto {rss.get('moto', 0):.0f}, other python {rss.get('python', 0):.0f} (not counted)")
        if rss.get("slurmd"):
            rep.figure(f"N={n} RSS per slurmd", rss["slurmd"] / n, "MiB")
        rep.figure(f"N={n} machine used memory delta", med(n, lambda r: r["used_delta_mib"]), "MiB",
                   note="shared machine: other helpers' load is in it")
        for label in ("sinfo", "squeue", "listing"):
            s = med(n, lambda r, label=label: r["parse_us"][label])
            rep.figure(f"N={n} parse {label}", s, "us", note="product parser on this cluster's real output")
        rep.figure(f"N={n} node logs collected", float(min(r["collected_logs"] for r in by_n[n])), "logs",
                   target=f"{n}")
    if ceiling:
        rep.figure(f"ceiling N={ceiling['nodes']} ran the light job", 1.0 if ceiling["ok"] else 0.0, "yes=1",
                   note=ceiling.get("note", ""))
        for p, data in ceiling.get("phases", {}).items():
            rep.figure(f"ceiling N={ceiling['nodes']} {p} wall time", data["wall_s"], "s")
        if ceiling.get("slurm", {}).get("queued_s"):
            rep.figure(f"ceiling N={ceiling['nodes']} job: submit to Slurm start", ceiling["slurm"]["queued_s"], "s",
                       note="nodes power up: slurmd starts on 2 cores")
        if ceiling.get("rss_job_mib"):
            daemons = {k: v for k, v in ceiling["rss_job_mib"].items() if k not in ("moto", "python")}
            rep.figure(f"ceiling N={ceiling['nodes']} cluster daemons RSS", sum(daemons.values()), "MiB",
                       note=f"slurmd {daemons.get('slurmd', 0):.0f}, unshare {daemons.get('unshare', 0):.0f}")
    rep.figure("repetitions", float(min(reps.values())), "per N",
               note=", ".join(f"N={n}: {k}" for n, k in sorted(reps.items())))
    print(f"scale: wrote {rep.save()}")


# ------------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="2,16,32,64")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per node count, as the budget allows")
    parser.add_argument("--ceiling", type=int, default=89, help="one extra cluster of this size; 0: skip")
    parser.add_argument("--budget-s", type=float, default=470, help="no repetition that would end past this")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]

    home = Path(tempfile.mkdtemp(prefix="uc-bench-scale-", dir="/tmp"))
    home.chmod(0o755)
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, **SLOTS, "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "LOCAL_ULTRACLUSTER_HOME": str(home)}
    os.environ.update({k: env[k] for k in (*SLOTS, "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                                           "AWS_SECRET_ACCESS_KEY", "LOCAL_ULTRACLUSTER_HOME")})
    started = time.monotonic()
    results: list[dict] = []
    ceiling = None
    reps: dict[int, int] = Counter()
    try:
        done = admin(env, "up", "--endpoint", endpoint)
        if done.returncode != 0:
            raise SystemExit(f"local-ultracluster up failed: {done.stdout} {done.stderr}")
        set_connections(home, endpoint)
        calls = Calls()
        calls.install()
        subnet = make_subnet(endpoint)
        script = home / "job.sh"
        script.write_text(JOB_SCRIPT)
        took: dict[int, float] = {}
        for n in counts:  # one of each first, so every N is measured whatever the budget
            t = time.monotonic()
            results.append(rehearse(n, 0, home, subnet, calls, script))
            took[n], reps[n] = time.monotonic() - t, reps[n] + results[-1]["ok"]
        if args.ceiling:
            try:
                ceiling = rehearse(args.ceiling, 0, home, subnet, calls, script)
            except Exception as err:  # the ceiling is what it finds, not a failure of the benchmark
                ceiling = {"nodes": args.ceiling, "ok": False, "note": f"{type(err).__name__}: {err}"[:300]}
                print(f"scale: ceiling {args.ceiling}: {ceiling['note']}", flush=True)
        for rep in range(1, args.reps):
            for n in counts:
                if time.monotonic() - started + took[n] > args.budget_s:
                    print(f"scale: no repetition {rep + 1} at N={n}: it would end past {args.budget_s:.0f} s",
                          flush=True)
                    continue
                results.append(rehearse(n, rep, home, subnet, calls, script))
                reps[n] += results[-1]["ok"]
        report(results, ceiling, dict(reps))
        (REPO / "bench" / "results").mkdir(exist_ok=True)
        (REPO / "bench" / "results" / "scale-raw.json").write_text(json.dumps(
            {"runs": results, "ceiling": ceiling}, indent=2, default=str) + "\n")
    finally:
        admin(env, "down", timeout=300)
        shutil.rmtree(home, ignore_errors=True)
        print(f"scale: {time.monotonic() - started:.0f} s in all; home {home} torn down", flush=True)


if __name__ == "__main__":
    main()
