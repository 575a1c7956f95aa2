"""Benchmarks 2, 3, 4, 6 (issue 13) and 9 (issue 24): whole runs of trn1_bert_pretrain under a real scheduler and
triggerer, against the no-op DAG of the same shape, in one deployment of their own.

    .venvs/airflow/bin/python bench/pipeline.py

The no-op DAG 3 times, the no-op DAG with the four waits deferred 3 times, then 3 pairs of pipeline
runs with the local profile's defaults but one node and 12 training steps: a cold run with a fresh
compile cache prefix in S3, then a warm run on the same prefix. One run at a time.

2. Orchestration overhead: the run's wall time (Airflow's run record) minus the union of the times
   the local cluster was busy — provisioning (the create call in logs/clusters.jsonl to the
   cluster's CREATE_COMPLETE in cluster.json), each Slurm job (Slurm's SubmitTime to EndTime in its
   job completion log: power-up of dynamic nodes included), the delete (the delete-cluster call to
   the "deleted" ledger line) — over the no-op DAG's wall time.
   Its floor: the same shape with the pipeline's four waits deferred to a trigger that ends the task
   and no work at all (bench/dags/ultracluster_bench_noop.py), its wall less the four waits, over the
   same baseline: what Airflow itself costs the pipeline's shape, which no change to the work can remove.
3. Reaction latency per wait, from the state change as the local cluster, Slurm or moto records it,
   to the trigger's event ("Trigger fired event", Airflow's own line) and to the next task's start,
   and from the event to the next task's start (Airflow's hops; for wait_for_fleet, which looks once
   in its worker first, also CREATE_COMPLETE to the ``ready_at`` of its XCom);
   with the SSH connections (sshd's log), pcluster calls (logs/pcluster-calls.jsonl) and AWS requests
   (moto's log) made while deferred, and per hour of waiting at the production profile's rates.
4. Worker-slot seconds per wait: the task log's worker segments (Pre Execute to the end of Post
   Execute), against the time deferred.
6. Compile cache: parallel_compile on the warm run as a fraction of the cold run (task instance
   duration; Slurm's own run time of the job).
9. Time to first step: from the trigger (the run's queued_at) to the training program's first step
   done (results.json's "First step"), split by phase (bench/_first_step.py); a measured breakdown,
   not a ratio.

Then, in the same deployment, bench/concurrency.py's run(deployment) if that module exists.

Knobs (environment): BENCH_PIPELINE_PAIRS (3), BENCH_SLOT_MAX (the deployment's last cluster slot),
BENCH_SKIP_CONCURRENCY, BENCH_TORCH_COMPILE (default on: the local profile runs eagerly, so its compile
cache would hold no graphs and benchmark 6 would find nothing to reuse; torch.compile gives the cache
what neuron_parallel_compile gives it in production, at about a minute more per cold run; "auto" runs
the profile's own way).
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _first_step as fs  # noqa: E402
import _timeline as tl  # noqa: E402
from _collect import DAG_ID, WAITS, collect  # noqa: E402
from _deploy import Deployment  # noqa: E402
from _record import RESULTS, Report, summary  # noqa: E402
from _watch import ClusterWatch  # noqa: E402
from dags.ultracluster_bench_noop import WAITS as NOOP_WAITS  # noqa: E402
from dags.ultracluster_bench_noop import WAIT_S as NOOP_WAIT_S  # noqa: E402

NOOP_ID = "ultracluster_bench_noop"
NOOP_DEFERRED_ID = "ultracluster_bench_noop_deferred"
PAIRS = int(os.environ.get("BENCH_PIPELINE_PAIRS", "3"))
RUN_TIMEOUT_S = 900
# The production profile's poll intervals over the local profile's (docs/operations.md, "Waits and
# their rates"): polled waits make calls in proportion to 1/interval. The Slurm waits hold one
# connection per wait whatever its length, and poll on the head node, not through pcluster or AWS.
POLL_PARAM = {"create": "cluster_poll_interval_s", "fleet": "fleet_poke_interval_s",
              "delete_cluster": "cluster_poll_interval_s", "delete_vpc": "cluster_poll_interval_s"}


def _state_change(wait: str, r: dict) -> float | None:
    if wait in ("create", "fleet"):
        return r["create_complete"]
    if wait in ("compile", "train"):
        jobs = tl.submitted_jobs(r["logs"].get(WAITS[wait][0], []))
        job = r["jobs"].get(jobs[-1]) if jobs else None
        return job["end"] if job else None
    return r["deleted"] if wait == "delete_cluster" else r["stack_deleted"]


def analyse(r: dict) -> dict:
    """Benchmarks 2/3/4/6 figures of one collected run."""
    busy = [(r["created"], r["create_complete"]), (r["delete_requested"], r["deleted"])]
    busy += [(job["submit"], job["end"]) for job in r["jobs"].values() if job["submit"] and job["end"]]
    busy = [(s, e) for s, e in busy if s is not None and e is not None]
    wall = r["end"] - r["start"]
    busy_s = tl.covered(busy, (r["start"], r["end"]))
    out = {"run_id": r["run_id"], "wall_s": wall, "busy_s": busy_s, "overhead_s": wall - busy_s, "waits": {}}
    # Where the overhead goes: time with no task running and the cluster idle (Airflow's hops), and each
    # task's time off the cluster (parallel tasks overlap, so these add up to more than the overhead).
    spans = [(t, ti["start"], ti["end"]) for t, ti in r["tis"].items() if ti.get("start") and ti.get("end")]
    out["between_tasks_s"] = wall - tl.covered(busy + [(s, e) for _, s, e in spans], (r["start"], r["end"]))
    out["off_cluster_s"] = {t: (e - s) - tl.covered(busy, (s, e)) for t, s, e in spans}
    for wait, (task, following) in WAITS.items():
        events = r["logs"].get(task, [])
        change = _state_change(wait, r)
        fires = tl.fired(events)
        fire = fires[-1] if fires and change is not None and fires[-1] >= change - 1 else None
        starts = [r["tis"][t]["start"] for t in following if r["tis"].get(t, {}).get("start")]
        nxt = min(starts) if starts else (r["end"] if not following else None)
        windows = tl.deferred_windows(events)
        deferred_s = sum(e - s for s, e in windows)
        watching = max([change, *tl.deferred(events)[:1]]) if change is not None else None
        out["waits"][wait] = {
            "to_event_s": fire - change if fire is not None else None,
            # Airflow's part: the trigger's event (the task ends there, or a worker resumes it) to the next task
            "event_to_next_s": nxt - fire if nxt is not None and fire is not None else None,
            # from when the trigger could first see it: the change, or the deferral if that came later
            "watch_to_event_s": fire - watching if fire is not None else None,
            "to_next_s": nxt - change if nxt is not None and change is not None else None,
            "worker_s": sum(e - s for s, e in tl.worker_segments(events)),
            "deferred_s": deferred_s,
            "ssh": tl.count_in(r["ssh"], windows, slack=r["ssh_resolution"]),
            "pcluster": tl.count_in(r["calls"], windows),
            # moto logs whole seconds, truncated: a request at t is logged in [t - 1, t]
            "aws": tl.count_in(r["aws"], [(s - 1, e) for s, e in windows]),
        }
    # wait_for_fleet looks once in its worker first: a fleet ready then has no trigger event
    fleet = r["xcoms"].get("wait_for_fleet") if isinstance(r["xcoms"].get("wait_for_fleet"), dict) else {}
    seen = tl.parse_time(fleet.get("ready_at"))
    done = r["create_complete"]
    out["waits"]["fleet"]["to_seen_ready_s"] = seen - done if seen is not None and done is not None else None
    # Where CREATE_COMPLETE -> fleet seen ready goes: pcluster_create's end, wait_for_fleet's start
    out["fleet_chain"] = {step: (t - done if t is not None and done is not None else None) for step, t in (
        ("pcluster_create ends", r["tis"].get("pcluster_create", {}).get("end")),
        ("wait_for_fleet starts", r["tis"].get("wait_for_fleet", {}).get("start")))}
    ti = r["tis"].get("parallel_compile", {})
    jobs = tl.submitted_jobs(r["logs"].get("parallel_compile", []))
    job = r["jobs"].get(jobs[-1]) if jobs else None
    restored = r["xcoms"].get("restore_compile_cache") or {}
    cache = (r["xcoms"].get("parallel_compile") or {}).get("compile_cache") if isinstance(
        r["xcoms"].get("parallel_compile"), dict) else None
    out["compile"] = {"ti_s": ti.get("duration"), "restored": restored.get("restored") if isinstance(
                          restored, dict) else None, "cache": cache,
                      "slurm_run_s": job["end"] - job["start"] if job and job["start"] and job["end"] else None}
    try:
        out["first_step"] = fs.phases(r)
    except fs.MissingMark as missing:
        out["first_step"] = None
        print(f"pipeline: time to first step of {r['run_id']}: no {missing}", flush=True)
    return out


def _per_hour(wait: str, w: dict, key: str, local: dict, production: dict) -> float | None:
    if not w["deferred_s"]:
        return None
    if wait in ("compile", "train"):
        return float(w[key]) if key == "ssh" else w[key] / w["deferred_s"] * 3600
    param = POLL_PARAM[wait]
    return w[key] / w["deferred_s"] * 3600 * float(local[param]) / float(production[param])


def _fig(report: Report, label: str, values: list, unit: str, target: str = "", note: str = "") -> None:
    values = [v for v in values if v is not None]
    if values:
        report.figure(label, summary(values), unit, target, note)
    else:
        print(f"{report.name}: {label}: no samples", flush=True)


def report_figures(noop_walls: list[float], runs: list[dict], deferred_walls: list[float] = ()) -> Report:
    from ultracluster.run.profiles import load_profile

    local, production = load_profile("local"), load_profile("production")
    report = Report("pipeline", "Whole pipeline: overhead, reaction latency, worker-slot seconds, compile cache")
    noop = statistics.median(noop_walls)
    _fig(report, "no-op DAG wall time", noop_walls, "s", note="15 no-op tasks, the pipeline's shape")
    _fig(report, "pipeline wall time", [r["wall_s"] for r in runs], "s")
    _fig(report, "local cluster busy (union)", [r["busy_s"] for r in runs], "s",
         note="provisioning + Slurm jobs (submit to end) + delete")
    _fig(report, "2. overhead / no-op wall", [r["overhead_s"] / noop for r in runs], "ratio", "<= 1.3",
         "overhead = wall - busy; median no-op wall as the baseline")
    waited = len(NOOP_WAITS) * NOOP_WAIT_S
    _fig(report, "no-op DAG with its waits deferred: wall time", list(deferred_walls), "s",
         note=f"the same shape; {len(NOOP_WAITS)} tasks defer {NOOP_WAIT_S:g} s each and end in the triggerer")
    _fig(report, "2. floor: overhead of the shape with its waits, no work / no-op wall",
         [(w - waited) / noop for w in deferred_walls], "ratio",
         note=f"(wall - {waited:g} s waited) over the median no-op wall: Airflow's own cost of the waits")
    if deferred_walls:
        floor = statistics.median(deferred_walls) - waited
        _fig(report, "2. overhead above the floor", [r["overhead_s"] - floor for r in runs], "s",
             note="the pipeline's own work off the cluster: moto, pcluster, SSH, S3; and what it exposes")
    for kind, picked in (("cold", runs[0::2]), ("warm", runs[1::2])):
        _fig(report, f"2. overhead / no-op wall ({kind})", [r["overhead_s"] / noop for r in picked], "ratio")
    _fig(report, "2. overhead: no task running, cluster idle", [r["between_tasks_s"] for r in runs], "s",
         note="Airflow's hops between tasks")
    for task in sorted({t for r in runs for t in r["off_cluster_s"]}):
        _fig(report, f"2. overhead: {task} off the cluster", [r["off_cluster_s"].get(task) for r in runs], "s",
             note="the task's span less the cluster's busy time in it")
    for wait in WAITS:
        ws = [r["waits"][wait] for r in runs]
        _fig(report, f"3. {wait}: state change -> trigger event", [w["to_event_s"] for w in ws], "s", "2 s median")
        _fig(report, f"3. {wait}: trigger watching -> trigger event", [w["watch_to_event_s"] for w in ws], "s",
             note="from the later of the change and the deferral")
        _fig(report, f"3. {wait}: state change -> next task start", [w["to_next_s"] for w in ws], "s")
        _fig(report, f"3. {wait}: trigger event -> next task start", [w["event_to_next_s"] for w in ws], "s",
             "< 1 s median", "Airflow's hops after the event: none to a worker where the trigger ends the task")
        if wait == "fleet":
            for step in ("pcluster_create ends", "wait_for_fleet starts"):
                _fig(report, f"3. fleet: CREATE_COMPLETE -> {step}", [r["fleet_chain"][step] for r in runs], "s")
            _fig(report, "3. fleet: CREATE_COMPLETE -> fleet seen ready", [w["to_seen_ready_s"] for w in ws], "s",
                 "2 s median", "ready_at in wait_for_fleet's XCom: its worker's first look, or its trigger")
        for key, what in (("ssh", "SSH connections"), ("pcluster", "pcluster calls"), ("aws", "AWS requests")):
            _fig(report, f"3. {wait}: {what} per wait", [w[key] for w in ws], "count", note="while deferred")
            _fig(report, f"3. {wait}: {what} per hour (production rates)",
                 [_per_hour(wait, w, key, local, production) for w in ws], "/h",
                 note="held connection: per wait" if wait in ("compile", "train") and key == "ssh" else
                 "measured rate (tasks beside it included)" if wait in ("compile", "train")
                 else "measured rate x local/production poll interval")
    for wait in WAITS:
        _fig(report, f"4. {wait}: worker seconds", [r["waits"][wait]["worker_s"] for r in runs], "s",
             "a few s", "Pre Execute to end of Post Execute, summed")
        _fig(report, f"4. {wait}: seconds deferred", [r["waits"][wait]["deferred_s"] for r in runs], "s")
    _fig(report, "4. worker seconds of all waits per run", [sum(w["worker_s"] for w in r["waits"].values())
                                                            for r in runs], "s")
    _fig(report, "4. worker seconds of all waits / run wall", [sum(w["worker_s"] for w in r["waits"].values())
                                                               / r["wall_s"] for r in runs], "ratio")
    pairs = list(zip(runs[0::2], runs[1::2]))
    _fig(report, "6. parallel_compile warm / cold (task instance)",
         [tl.ratio(w["compile"]["ti_s"], c["compile"]["ti_s"]) for c, w in pairs], "ratio")
    _fig(report, "6. parallel_compile warm / cold (Slurm run time)",
         [tl.ratio(w["compile"]["slurm_run_s"], c["compile"]["slurm_run_s"]) for c, w in pairs], "ratio")
    restored = [r["compile"]["restored"] for r in runs[1::2]]
    report.figure("6. warm runs that restored the cold run's cache", float(sum(1 for x in restored if x)), "count",
                  note="compile_cache per run: " + "; ".join(str(r["compile"]["cache"]) for r in runs)[:300])
    for kind, picked in (("cold", runs[0::2]), ("warm", runs[1::2])):
        _fig(report, f"6. parallel_compile task instance ({kind})", [r["compile"]["ti_s"] for r in picked], "s")
        _fig(report, f"6. parallel_compile Slurm run ({kind})", [r["compile"]["slurm_run_s"] for r in picked], "s")
    return report


def first_step_figures(runs: list[dict]) -> Report:
    """Benchmark 9: trigger to first step, each phase over the runs (cold and warm together but the
    totals, and the compile phase, which the cache shortens)."""
    report = Report("first_step", "Time to first step: trigger to the first training step, by phase")
    measured = [r for r in runs if r.get("first_step")]
    for kind, picked in (("cold", runs[0::2]), ("warm", runs[1::2])):
        _fig(report, f"9. trigger to first step ({kind})", [r["first_step"]["total_s"] for r in picked
                                                           if r.get("first_step")], "s")
    names = [phase["phase"] for phase in measured[0]["first_step"]["phases"]] if measured else []
    for i, name in enumerate(names):
        hops = [h for r in measured if (h := r["first_step"]["phases"][i]["hop_s"]) is not None]
        note = f"of which Airflow's hop before the task: median {statistics.median(hops):.1f} s" if hops else ""
        groups = ((f" ({kind})", picked) for kind, picked in (("cold", runs[0::2]), ("warm", runs[1::2]))
                  ) if name.startswith("compile") else (("", measured),)
        for suffix, picked in groups:
            _fig(report, f"9. {name}{suffix}", [r["first_step"]["phases"][i]["s"] for r in picked
                                                if r.get("first_step")], "s", note=note)
    return report


def _conf(prefix: str) -> dict:
    from ultracluster.run.profiles import load_profile
    from ultracluster.run.s3 import split_s3_uri

    profile = load_profile("local")
    bucket, _key = split_s3_uri(profile["artifacts_s3_uri"])
    # One node and 12 training steps, not the profile's 2 and 40: overhead and reaction depend on
    # neither (benchmark 8 covers node counts), and a second torch process on 2 cores measures contention.
    conf = {"compile_cache_s3_uri": f"s3://{bucket}/bench-cache/{prefix}/", "num_nodes": 1,
            "max_steps": 12, "steps_this_run": 12}
    torch_compile = os.environ.get("BENCH_TORCH_COMPILE", "on")
    if torch_compile != "auto":  # a cache with graphs in it
        conf["extra_job_env"] = {**profile["extra_job_env"], "TORCH_COMPILE": torch_compile}
    return conf


def _run(d: Deployment, dag_id: str, conf: dict | None, failures: list[str]) -> dict:
    """One successful run; a failed one is reported (which task, its log's end) and run again, twice
    at most: a loaded shared machine can fail a task (e.g. a worker killed for a missed heartbeat)."""
    for _attempt in range(3):
        run = d.wait(dag_id, d.trigger(dag_id, conf), timeout=RUN_TIMEOUT_S)
        if run["state"] == "success":
            return run
        failed = [ti for ti in d.task_instances(dag_id, run["dag_run_id"]) if ti["state"] not in ("success", "skipped")]
        failures.append(f"{dag_id} {run['dag_run_id']}: " + ", ".join(f"{ti['task_id']}={ti['state']}" for ti in failed))
        print(f"pipeline: run FAILED: {failures[-1]}", flush=True)
        for ti in failed[:2]:
            if ti.get("try_number"):
                tail = d.task_log(dag_id, run["dag_run_id"], ti["task_id"], ti["try_number"])[-6:]
                print("\n".join(f"    {line.get('timestamp')} {line.get('event')}" for line in tail
                                if isinstance(line, dict)), flush=True)
    raise RuntimeError(f"{dag_id}: three runs failed: {failures[-3:]}")


def run_pipeline_benchmarks(d: Deployment) -> Report:
    for dag_id in (NOOP_ID, NOOP_DEFERRED_ID, DAG_ID):
        d.wait_for_dag(dag_id)
    walls, failures = {NOOP_ID: [], NOOP_DEFERRED_ID: []}, []
    for dag_id, wall in walls.items():
        for _ in range(3):
            run = _run(d, dag_id, None, failures)
            wall.append(tl.parse_time(run["end_date"]) - tl.parse_time(run["start_date"]))
            print(f"pipeline: {dag_id} run {len(wall)}: {wall[-1]:.1f} s, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    noop_walls, deferred_walls = walls[NOOP_ID], walls[NOOP_DEFERRED_ID]
    records, runs = [], []
    with ClusterWatch(d.home) as watch:
        for pair in range(PAIRS):
            conf = _conf(uuid.uuid4().hex[:12])
            for kind in ("cold", "warm"):
                run = _run(d, DAG_ID, conf, failures)
                record = collect(d, watch, run)
                records.append(record)
                runs.append(analyse(record))
                print(f"pipeline: pair {pair + 1} {kind}: wall {runs[-1]['wall_s']:.1f} s, busy "
                      f"{runs[-1]['busy_s']:.1f} s, compile {runs[-1]['compile']}, load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pipeline-runs.json").write_text(json.dumps(
        {"noop_walls": noop_walls, "noop_deferred_walls": deferred_walls, "failed_runs": failures, "runs": runs,
         "records": records}, indent=1, default=str) + "\n")
    report = report_figures(noop_walls, runs, deferred_walls)
    report.figure("runs failed and run again", float(len(failures)), "count", "0", "; ".join(failures)[:300])
    print(f"pipeline: tables in {report.save()}", flush=True)
    print(f"pipeline: tables in {first_step_figures(runs).save()}", flush=True)
    return report


def _stop(signum, _frame) -> None:
    raise SystemExit(128 + signum)  # through the deployment's exit: nothing left running


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    extra = {"LOCAL_UC_SLOT_MAX": os.environ["BENCH_SLOT_MAX"]} if os.environ.get("BENCH_SLOT_MAX") else None
    with Deployment("pipeline", extra_env=extra) as d:
        run_pipeline_benchmarks(d)
        if os.environ.get("BENCH_SKIP_CONCURRENCY"):
            return
        try:
            import concurrency
        except ModuleNotFoundError as missing:
            if missing.name != "concurrency":
                raise
            print("pipeline: no bench/concurrency.py; concurrency benchmark skipped", flush=True)
        else:
            concurrency.run(d)


if __name__ == "__main__":
    main()
