"""One place for what every benchmark records: figures as median/min/max of repeated samples,
the machine, the versions and the date, written to bench/results/<name>.json and .md.

Stdlib only: benchmarks run in the Airflow venv and in the training venv.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def summary(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(command: list[str]) -> str | None:
    if not shutil.which(command[0]) and not Path(command[0]).exists():
        return None
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else None


def machine() -> dict:
    venvs = REPO / ".venvs"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(), "python": platform.python_version(),
        # a shared machine: what else ran meanwhile (1, 5 and 15 min load averages, when the report is saved)
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "airflow": _version([str(venvs / "airflow" / "bin" / "airflow"), "version"]),
        "slurm": _version(["/usr/sbin/slurmctld", "-V"]),  # reads no slurm.conf, unlike sinfo
        "torch": _version([str(venvs / "training" / "bin" / "python"), "-c", "import torch; print(torch.__version__)"]),
        "commit": _version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
    }


class Report:
    """Figures of one benchmark: each printed as one line, then saved with the machine record."""

    def __init__(self, name: str, title: str) -> None:
        self.name, self.title = name, title
        self.rows: list[dict] = []

    def figure(self, label: str, value: float | dict, unit: str, target: str = "", note: str = "") -> None:
        row = {"figure": label, "unit": unit, "target": target, "note": note}
        row.update(value if isinstance(value, dict) else {"median": value})
        self.rows.append(row)
        spread = f"  (min {row['min']:.3g}, max {row['max']:.3g}, n={row['n']})" if "min" in row else ""
        print(f"{self.name}: {label} = {row['median']:.4g} {unit}{spread}"
              + (f"  target {target}" if target else ""), flush=True)

    def save(self) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        document = {"benchmark": self.name, "title": self.title, "machine": machine(), "figures": self.rows}
        (RESULTS / f"{self.name}.json").write_text(json.dumps(document, indent=2) + "\n")
        lines = [f"### {self.title}", "", "| figure | median | min | max | n | unit | target | note |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            cells = [f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in
                     ("median", "min", "max", "n")]
            lines.append(f"| {r['figure']} | " + " | ".join(cells) + f" | {r['unit']} | {r['target']} | {r['note']} |")
        m = document["machine"]
        lines += ["", f"{m['date']} · {m['cpus']} CPUs, {m['memory_gib']} GiB · Python {m['python']} · "
                      f"{m['airflow']} · {m['slurm']} · torch {m['torch']} · commit {m['commit']}", ""]
        path = RESULTS / f"{self.name}.md"
        path.write_text("\n".join(lines))
        return path
