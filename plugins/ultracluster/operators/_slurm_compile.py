"""What a compile job (SlurmJobOperator with a launcher) reports: its launch mode and cache figures."""

from __future__ import annotations

import json
from typing import Any


class SlurmCompileFactsMixin:
    """Needs SlurmJobOperator's ``hook``, ``job_dir`` and ``log``."""

    def _compile_cache_stats(self, results_path: str) -> dict[str, Any] | None:
        """The compile job's cache hits and misses, from its results.json (None when unreadable)."""
        from ultracluster import remote_commands

        text = self.hook.head_node_hook.check(remote_commands.read_file(results_path)).stdout
        try:
            metrics = json.loads(text)["results"]["metrics"]
        except (ValueError, KeyError, TypeError):
            self.log.warning("No readable results.json at %s: compile cache figures unknown", results_path)
            return None
        stats = {m["MetricName"]: m for m in metrics if str(m.get("MetricName", "")).startswith("Compile cache")}
        hits, misses = stats.get("Compile cache hits", {}), stats.get("Compile cache misses", {})
        figures = {"backend": (hits.get("AdditionalData") or {}).get("backend"),
                   "hits": hits.get("MeasuredValue"), "misses": misses.get("MeasuredValue")}
        self.log.info("Compile cache: backend=%s hits=%s misses=%s", *figures.values())
        return figures

    def _launch_mode(self, job_id: str) -> dict[str, str | None]:
        """What the job ran under, from the ``slurm-<id>.launch`` marker its wrap wrote."""
        from ultracluster import remote_commands
        from ultracluster.parsers.progress import parse_launch

        text = self.hook.tail_log(remote_commands.job_file(self.job_dir, job_id, "launch"), lines=5)
        launch = parse_launch(text)
        self.log.info("Compile mode: %s%s", launch["mode"], f" ({launch['path']})" if launch.get("path") else "")
        return launch
