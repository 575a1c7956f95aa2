"""Every shell command ultracluster runs on the head node is built here.

Rules this module keeps so callers cannot get them wrong:
- every interpolated value goes through ``shlex.quote`` (or is validated to a strict pattern first);
- secrets (presigned URLs) never appear in a command line: they travel on the command's stdin as a
  curl config (``curl -K -``), so they are not in ``ps`` on the head node, in logs or in XCom;
- ``str(command)`` is a short safe description, the text that is actually run is ``command.shell``.
"""

from ultracluster.remote_commands.command import RemoteCommand, check_job_id, env_words, from_argv
from ultracluster.remote_commands.files import *  # noqa: F403
from ultracluster.remote_commands.slurm import *  # noqa: F403
from ultracluster.remote_commands.slurm import SINFO_FORMAT, SQUEUE_FORMAT
from ultracluster.remote_commands.wait import WAIT_END_MARKER, wait_job_end, wait_nodes_change

__all__ = ["SINFO_FORMAT", "SQUEUE_FORMAT", "WAIT_END_MARKER", "RemoteCommand", "check_job_id", "env_words",
           "from_argv", "wait_job_end", "wait_nodes_change"]
