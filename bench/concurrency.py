"""Benchmark 7, concurrency: a 3-point weak-scaling sweep (1, 2, 3 nodes) run concurrently against
the same sweep run one point after another, in the same deployment.

Both legs use the product's own way, `ultracluster sweep --via backfill` (ultracluster.cli.sweeps):
a backfill over the last 3 weekly ticks with max_active_runs 1 (sequential) or 3 (concurrent; a
backfill's own max_active_runs, not the DAG's 2, governs its runs), each under a fresh sweep id with
one shared network (trn1_sweep_network). Each sweep is a fresh cluster per point and a cold compile
(compile_cache_s3_uri null: nothing kept between runs), so both legs start from the same state.

Measured per leg: wall time from the REST run records (first run's start to last run's end, the
network DAG's run included), the trains' overlap from the TI records, memory used above the idle
baseline (/proc/meminfo, every 0.5 s), the RSS of the deployment's local clusters (daemons and
training processes), the CPU busy fraction (/proc/stat) and each point's train throughput
(collect_results' XCom).

    run(deployment)                               # pipeline.py, in its own deployment
    .venvs/airflow/bin/python bench/concurrency.py [--reps N]   # standalone: a deployment of its own
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _deploy import Deployment  # noqa: E402 - puts the repo's packages on sys.path
from _record import Report, summary  # noqa: E402

from ultracluster.cli.follow import xcom_value  # noqa: E402
from ultracluster.cli.main import build_parser  # noqa: E402
from ultracluster.cli.sweeps import backfill, sweep_conf  # noqa: E402

NODES = "1,2,3"
# 12 of 40 steps per point, as the README's local sweep: throughput is measured, time to train extrapolated.
PARAMS = ["max_steps=40", "steps_this_run=12", "compile_cache_s3_uri=null"]
LEGS = (("sequential", 1), ("concurrent", 3))
RUN_TIMEOUT_S = 1200
SAMPLE_S = 0.5


def _parse(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


def _meminfo_used_mib() -> float:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        fields[key] = int(rest.split()[0])
    return (fields["MemTotal"] - fields["MemAvailable"]) / 1024


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot; busy excludes idle and iowait."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(values[:8])  # guest time is already counted in user/nice
    return total - values[3] - values[4], total


def _processes() -> dict[int, tuple[int, str, int, str, tuple[str, int]]]:
    """pid -> (ppid, cmdline, rss KiB, mount namespace, (start time, CPU ticks used)) of every
    process still readable."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            mnt = os.readlink(f"{entry.path}/ns/mnt")
            stat = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss = int(fields.get("VmRSS", "0 kB").split()[0])
        # stat after the command: state is field 3, utime/stime 14/15, starttime 22
        found[int(entry.name)] = (int(fields.get("PPid", "0")), cmdline, rss, mnt,
                                  (stat[19], int(stat[11]) + int(stat[12])))
    return found


def cluster_usage(clusters_dir: str) -> tuple[float, dict[tuple[int, str], int]]:
    """RSS of the deployment's local clusters: every process whose command line names a cluster
    directory of this home (slurmctld, slurmd, sshd, munged) and every process in their nodes' own
    mount namespaces (slurmstepd daemonizes away from slurmd, so the training ranks are found so);
    with each one's CPU ticks so far, keyed by (pid, start time)."""
    procs = _processes()
    host = os.readlink("/proc/self/ns/mnt")
    roots = {pid for pid, proc in procs.items() if clusters_dir in proc[1]}
    spaces = {procs[pid][3] for pid in roots} - {host}
    members = roots | {pid for pid, proc in procs.items() if proc[3] in spaces}
    cpu = {(pid, procs[pid][4][0]): procs[pid][4][1] for pid in members}
    return sum(procs[pid][2] for pid in members) / 1024, cpu


class Sampler(threading.Thread):
    """Memory used every 0.5 s and the clusters' RSS every other sample, until stopped."""

    def __init__(self, clusters_dir: str) -> None:
        super().__init__(daemon=True)
        self.clusters_dir, self.stopped = clusters_dir, threading.Event()
        self.used: list[float] = []
        self.rss: list[float] = []
        self.ticks: dict[tuple[int, str], int] = {}  # the clusters' processes' CPU, last seen

    def run(self) -> None:
        tick = 0
        while not self.stopped.is_set():
            self.used.append(_meminfo_used_mib())
            if tick % 2 == 0:
                rss, ticks = cluster_usage(self.clusters_dir)
                self.rss.append(rss)
                self.ticks.update(ticks)
            tick += 1
            self.stopped.wait(SAMPLE_S)

    def cluster_cpu_s(self, before: dict[tuple[int, str], int]) -> float:
        """CPU seconds the clusters' processes used in the leg (up to their last sample)."""
        hz = os.sysconf("SC_CLK_TCK")
        return sum(ticks - before.get(key, 0) for key, ticks in self.ticks.items()) / hz

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def idle_baseline(clusters_dir: str, seconds: float = 5) -> tuple[float, float]:
    """Median memory used and CPU busy fraction over a few idle seconds before a leg."""
    busy0, total0 = _cpu_times()
    used = []
    for _ in range(int(seconds / SAMPLE_S)):
        used.append(_meminfo_used_mib())
        time.sleep(SAMPLE_S)
    busy1, total1 = _cpu_times()
    return statistics.median(used), (busy1 - busy0) / max(total1 - total0, 1)


def sweep_args(sweep_id: str, max_active: int) -> argparse.Namespace:
    """`ultracluster sweep --via backfill` as a user types it (the parse gives every default)."""
    argv = ["sweep", "--id", sweep_id, "--nodes", NODES, "--mode", "weak", "--via", "backfill",
            "--max-active", str(max_active), "--wait-for-dag", "180", "--poll-interval", "2"]
    for param in PARAMS:
        argv += ["--param", param]
    return build_parser().parse_args(argv)


def interval(record: dict) -> tuple[float, float]:
    return _parse(record["start_date"]), _parse(record["end_date"])


def max_simultaneous(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


def backfills_done(deployment: Deployment, dag_id: str, timeout: float = 300) -> None:
    """Airflow refuses a backfill while another is active, and the scheduler marks one completed a
    loop or more after its last run ended: wait for that, as a user of the CLI would."""
    deadline = time.monotonic() + timeout
    while any(not b.get("completed_at") for b in
              deployment.api("GET", "/api/v2/backfills", dag_id=dag_id, limit=100)["backfills"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"a backfill of {dag_id} is still active after {timeout} s")
        time.sleep(2)


def run_leg(deployment: Deployment, name: str, max_active: int, rep: int) -> dict:
    """One sweep, followed to its end; its figures from Airflow's records and the samplers."""
    client, clusters_dir = deployment.client, str(deployment.home / "clusters")
    sweep_id = f"bench-{name[:3]}-{rep}-{uuid.uuid4().hex[:6]}"
    args = sweep_args(sweep_id, max_active)
    nodes = [int(n) for n in NODES.split(",")]
    backfills_done(deployment, args.dag)
    idle_used, idle_busy = idle_baseline(clusters_dir)
    sampler = Sampler(clusters_dir)
    _, before = cluster_usage(clusters_dir)  # processes older than the leg count only what they use in it
    busy0, total0 = _cpu_times()
    began = time.time()
    sampler.start()
    try:
        followed = backfill(client, args, sweep_conf(args, nodes), nodes, datetime.now(timezone.utc))
        runs = [(f.dag_id, f.run_id) for f in followed]
        network = getattr(args, "network_run", None)
        records = {run: deployment.wait(*run, timeout=RUN_TIMEOUT_S) for run in runs}
        net_record = deployment.wait(network.dag_id, network.run_id, timeout=RUN_TIMEOUT_S) if network else None
    finally:
        sampler.stop()
    busy1, total1 = _cpu_times()
    points = []
    for run, record in records.items():
        tis = {ti["task_id"]: ti for ti in deployment.task_instances(*run)}
        metrics = xcom_value(client, *run, "collect_results") or {}
        train = tis.get("train") or {}
        points.append({"run_id": run[1], "state": record["state"], "run": interval(record),
                       "nodes": metrics.get("nodes"), "train": interval(train) if train.get("end_date") else None,
                       "seq_per_s": metrics.get("average_throughput_seq_per_s")})
    if any(p["run"][0] < began for p in points):  # a reprocessed run must carry this leg's start
        raise RuntimeError(f"{name} sweep {sweep_id}: a run record starts before the leg: {points}")
    spans = [p["run"] for p in points] + ([interval(net_record)] if net_record else [])
    trains = [p["train"] for p in points if p["train"]]
    overlap = max(0.0, min(e for _, e in trains) - max(s for s, _ in trains)) if len(trains) == 3 else 0.0
    leg = {
        "name": name, "sweep_id": sweep_id, "points": points,
        "network": {"run_id": network.run_id, "state": net_record["state"]} if network else None,
        "wall_s": max(e for _, e in spans) - min(s for s, _ in spans),
        "points_wall_s": max(p["run"][1] for p in points) - min(p["run"][0] for p in points),
        "trains_at_once": max_simultaneous(trains), "trains_overlap_s": overlap,
        "peak_used_mib": max(sampler.used) - idle_used, "idle_used_mib": idle_used,
        "peak_cluster_rss_mib": max(sampler.rss, default=0.0),
        "cpu_busy": (busy1 - busy0) / max(total1 - total0, 1), "idle_cpu_busy": idle_busy,
        "cluster_cpu_s": sampler.cluster_cpu_s(before),
    }
    leg["cluster_cores"] = leg["cluster_cpu_s"] / leg["wall_s"]
    by_nodes = ", ".join(f"n={p['nodes']}: {p['seq_per_s'] or 0:.1f} seq/s ({p['state']})"
                         for p in sorted(points, key=lambda p: p["nodes"] or 0))
    print(f"concurrency: {name} rep {rep}: wall {leg['wall_s']:.0f} s, trains at once {leg['trains_at_once']}, "
          f"overlap {overlap:.0f} s, peak +{leg['peak_used_mib']:.0f} MiB, clusters' RSS "
          f"{leg['peak_cluster_rss_mib']:.0f} MiB, CPU busy {leg['cpu_busy']:.0%}, clusters' CPU "
          f"{leg['cluster_cpu_s']:.0f} s ({leg['cluster_cores']:.2f} cores); {by_nodes}", flush=True)
    return leg


def check(leg: dict) -> None:
    failed = [p["run_id"] for p in leg["points"] if p["state"] != "success"]
    if failed:
        raise RuntimeError(f"{leg['name']} sweep {leg['sweep_id']}: runs {failed} did not succeed")
    if leg["name"] == "concurrent" and leg["trains_at_once"] < 3:
        raise RuntimeError(f"concurrent sweep {leg['sweep_id']}: only {leg['trains_at_once']} trains at once")
    if leg["name"] == "sequential" and max_simultaneous([p["run"] for p in leg["points"]]) > 1:
        raise RuntimeError(f"sequential sweep {leg['sweep_id']}: points overlapped")


def node_cap(deployment: Deployment) -> str:
    cap = deployment.env.get("ULTRACLUSTER_MAX_LIVE_NODES") or ""
    if cap and int(cap) < 6:
        raise RuntimeError(f"ULTRACLUSTER_MAX_LIVE_NODES={cap}: the 3 points (6 nodes) cannot run at once")
    return f"max_live_nodes {cap}" if cap else "no node cap (max_live_nodes unset)"


def run(deployment: Deployment, reps: int = 1) -> None:
    cap = node_cap(deployment)
    for dag_id in ("trn1_bert_pretrain", "trn1_sweep_network"):  # the backfill's dry run needs them parsed
        deployment.wait_for_dag(dag_id)
    legs: dict[str, list[dict]] = {"sequential": [], "concurrent": []}
    for rep in range(reps):
        for name, max_active in LEGS:
            leg = run_leg(deployment, name, max_active, rep)
            check(leg)
            legs[name].append(leg)
    record(legs, cap)


def _figure(legs: list[dict], key: str) -> dict:
    return summary([leg[key] for leg in legs])


def record(legs: dict[str, list[dict]], cap: str) -> None:
    seq, con = legs["sequential"], legs["concurrent"]
    n = len(seq)
    one = "one sample per leg (a whole sweep each)" if n == 1 else f"{n} samples per leg, alternating"
    report = Report("concurrency", "7. Concurrency: a 3-point weak sweep (1, 2, 3 nodes), all at once "
                                   "against one after another")
    report.figure("wall time, concurrent / sequential", summary([c["wall_s"] / s["wall_s"] for s, c in zip(seq, con)]),
                  "ratio", note=f"{one}; REST run records, network DAG run included")
    for name, group in (("sequential", seq), ("concurrent", con)):
        report.figure(f"{name}: wall time", _figure(group, "wall_s"), "s",
                      note="first run's start to last run's end (3 points + trn1_sweep_network)")
        report.figure(f"{name}: peak memory above idle", _figure(group, "peak_used_mib"), "MiB",
                      note="/proc/meminfo MemTotal-MemAvailable every 0.5 s, minus the idle median before "
                           "the leg (machine-wide: shared machine)")
        report.figure(f"{name}: peak RSS of the local clusters", _figure(group, "peak_cluster_rss_mib"), "MiB",
                      note="slurmctld, slurmd, sshd, munged and every process in the nodes' namespaces (training), every 1 s")
        report.figure(f"{name}: CPU busy", summary([leg["cpu_busy"] * 100 for leg in group]), "%",
                      note="/proc/stat over the leg, both cores, every process (shared machine); before the "
                           "leg: " + ", ".join(f"{leg['idle_cpu_busy']:.0%}" for leg in group))
        report.figure(f"{name}: the clusters' CPU", _figure(group, "cluster_cpu_s"), "CPU s",
                      note="utime+stime of the clusters' processes (as the RSS), summed over the leg; per "
                           "wall second: " + ", ".join(f"{leg['cluster_cores']:.2f} cores" for leg in group))
    report.figure("concurrent: trains running at once", _figure(con, "trains_at_once"), "trains",
                  note=f"from the train TIs' start/end; {cap}; backfill max_active_runs 3")
    report.figure("concurrent: all 3 trains overlapped", _figure(con, "trains_overlap_s"), "s",
                  note="latest train start to earliest train end")
    for nodes in (1, 2, 3):
        rates = {name: [p["seq_per_s"] for leg in group for p in leg["points"] if p["nodes"] == nodes]
                 for name, group in (("sequential", seq), ("concurrent", con))}
        trains = {name: [p["train"][1] - p["train"][0] for leg in group for p in leg["points"]
                         if p["nodes"] == nodes and p["train"]] for name, group in (("sequential", seq), ("concurrent", con))}
        for name in ("sequential", "concurrent"):
            report.figure(f"{name}: {nodes}-node point train throughput", summary(rates[name]), "seq/s",
                          note=f"collect_results' average; train task {statistics.median(trains[name]):.0f} s")
        report.figure(f"{nodes}-node point throughput, concurrent / sequential",
                      summary([c / s for s, c in zip(rates["sequential"], rates["concurrent"])]), "ratio")
    print(f"concurrency: saved {report.save()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=1, help="sequential+concurrent pairs (1)")
    args = parser.parse_args()
    extra = {key: os.environ[key] for key in ("LOCAL_UC_SLOT_MIN", "LOCAL_UC_SLOT_MAX") if key in os.environ}
    with Deployment("concurrency", extra_env=extra or None) as deployment:
        run(deployment, reps=args.reps)


if __name__ == "__main__":
    main()
