"""The head-node side of the waits: one long-lived command per window instead of round-trip polls.

``wait_job_end`` checks the job locally about once a second (``squeue`` for that one job id: a single small RPC
to slurmctld) and copies the log's new bytes to stdout as they appear (``stat`` and ``tail``: no
inotify, which misses writes by other Lustre clients). It exits when the job leaves the active
states, when the log shrinks, or after ``window_s``; its last stderr line says which
(``parsers.slurm.parse_wait_end``).

``wait_nodes_change`` (the fleet wait's Slurm gate) runs ``sinfo`` locally about once a second and
exits, printing the new lines, as soon as they differ from the ones the trigger judged last: nodes
becoming idle, going down or failing to power up all change them, and every rule stays in the
trigger's one evaluation (``triggers.fleet``).
"""

from __future__ import annotations

import shlex

from ultracluster.remote_commands.command import RemoteCommand, check_job_id
from ultracluster.remote_commands.slurm import sinfo, slurm_command
from ultracluster.run.states import JOB_PENDING_STATES, JOB_RUNNING_STATES

WAIT_END_MARKER = "UC_WAIT_END"
# States in which the job may still change: anything else (or a job slurmctld forgot) ends the wait.
ACTIVE_STATES = tuple(sorted(JOB_PENDING_STATES | JOB_RUNNING_STATES))

_SCRIPT = r"""
job={job}; log={log}; off={offset}; interval={interval}; end=$((SECONDS + {window}))
copy() {{
  [ -f "$log" ] || return 0
  size=$(stat -c %s -- "$log" 2>/dev/null || echo "$off")
  if [ "$size" -lt "$off" ]; then echo "{marker} log-shrank" >&2; exit 0; fi
  if [ "$size" -gt "$off" ]; then tail -c +$((off + 1)) -- "$log" | head -c $((size - off)); off=$size; fi
}}
# After the job ends, copy once more: what it wrote between the last copy and the state check.
ended() {{ copy; echo "{marker} job-ended $1" >&2; exit 0; }}
while :; do
  copy
  if out=$({squeue} --noheader --states=all --jobs "$job" --format=%T 2>&1); then
    state=$(printf '%s\n' "$out" | head -n 1 | tr -d '[:space:]')
    case " {active} " in
      *" $state "*) ;;
      *) ended "${{state:-GONE}}" ;;
    esac
  elif printf '%s' "$out" | grep -qi 'invalid job id'; then
    ended GONE
  fi
  if [ "$SECONDS" -ge "$end" ]; then echo "{marker} window" >&2; exit 0; fi
  sleep "$interval"
done
"""


def wait_job_end(job_id: str | int, log_path: str, log_offset: int, *, interval_s: float, window_s: int) -> RemoteCommand:
    """Stream ``log_path`` from ``log_offset`` until job ``job_id`` ends or ``window_s`` passes.

    A failing ``squeue`` (slurmctld briefly unreachable) does not end the wait: the next check
    tries again, and the trigger's own status read decides after the window.
    """
    if interval_s <= 0 or window_s <= 0:
        raise ValueError("interval_s and window_s must be positive")
    script = _SCRIPT.format(job=check_job_id(job_id), log=shlex.quote(log_path), offset=max(0, int(log_offset)),
                            interval=f"{float(interval_s):g}", window=int(window_s), marker=WAIT_END_MARKER,
                            active=" ".join(ACTIVE_STATES), squeue=shlex.quote(slurm_command("squeue")))
    return RemoteCommand(shell=f"bash -c {shlex.quote(script)}",
                         description=f"wait for job {job_id} (streaming {log_path} from byte {int(log_offset)})")


_NODES_SCRIPT = r"""
seen=$(cat); interval={interval}; end=$((SECONDS + {window}))
while :; do
  if out=$({sinfo} 2>/dev/null) && [ "$out" != "$seen" ]; then
    printf '%s\n' "$out"; echo "{marker} changed" >&2; exit 0
  fi
  if [ "$SECONDS" -ge "$end" ]; then echo "{marker} window" >&2; exit 0; fi
  sleep "$interval"
done
"""


def wait_nodes_change(partition: str | None, seen: str, *, interval_s: float, window_s: int) -> RemoteCommand:
    """Until ``sinfo(partition)`` prints something other than ``seen`` (sent on stdin), or ``window_s``.

    The output compares as the shell captures it (trailing newlines dropped). A failing ``sinfo``
    (slurmctld restarting) does not end the wait: the next check tries again.
    """
    if interval_s <= 0 or window_s <= 0:
        raise ValueError("interval_s and window_s must be positive")
    script = _NODES_SCRIPT.format(sinfo=sinfo(partition).shell, interval=f"{float(interval_s):g}",
                                  window=int(window_s), marker=WAIT_END_MARKER)
    return RemoteCommand(shell=f"bash -c {shlex.quote(script)}", stdin=seen,
                         description=f"wait for a change of sinfo {partition or '(default partition)'}")
