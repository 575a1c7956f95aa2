"""File, transfer and process-group commands on the head node."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

from ultracluster.remote_commands.command import RemoteCommand, from_argv


def make_dirs(*paths: str) -> RemoteCommand:
    return from_argv("mkdir", "-p", "--", *paths)


def read_file(path: str, max_bytes: int = 1_000_000) -> RemoteCommand:
    """The file's content, or empty output (exit 0) when it does not exist."""
    quoted = shlex.quote(path)
    return RemoteCommand(
        shell=f"if [ -f {quoted} ]; then head -c {int(max_bytes)} -- {quoted}; fi",
        description=f"read {path}",
    )


def read_log_chunk(path: str, offset: int, max_bytes: int = 262_144) -> RemoteCommand:
    """File size on the first line, then up to max_bytes from byte offset, base64 on one line.

    base64 keeps byte offsets exact whatever the log's encoding; a missing log prints size -1.
    """
    quoted = shlex.quote(path)
    start = int(offset) + 1  # tail -c +N is 1-based
    return RemoteCommand(
        shell=(
            f"if [ -f {quoted} ]; then stat -c %s -- {quoted}; "
            f"tail -c +{start} -- {quoted} | head -c {int(max_bytes)} | base64 -w0; echo; "
            f"else echo -1; fi"
        ),
        description=f"read {path} from byte {int(offset)}",
    )


def tail_lines(path: str, lines: int = 40) -> RemoteCommand:
    quoted = shlex.quote(path)
    return RemoteCommand(
        shell=f"if [ -f {quoted} ]; then tail -n {int(lines)} -- {quoted}; fi",
        description=f"tail -n {int(lines)} {path}",
    )


def list_files(directory: str, max_depth: int = 4) -> RemoteCommand:
    """``<size> <path relative to directory>`` per regular file, or nothing if it is missing."""
    quoted = shlex.quote(directory)
    return RemoteCommand(
        shell=(
            f"if [ -d {quoted} ]; then find {quoted} -maxdepth {int(max_depth)} -type f "
            f"-printf '%s %P\\n' | LC_ALL=C sort -k2; fi"
        ),
        description=f"list files under {directory}",
    )


def write_file(path: str, content: str) -> RemoteCommand:
    """Atomically replace a small text file (content on stdin, never in the command line)."""
    quoted, tmp = shlex.quote(path), shlex.quote(path + ".tmp")
    return RemoteCommand(
        shell=f"cat > {tmp} && mv -f -- {tmp} {quoted}",
        description=f"write {path}",
        stdin=content,
    )


# ----------------------------------------------------------------------------------- dataset


def _curl_config(entries: Iterable[tuple[str, str]]) -> str:
    """curl ``-K`` config text; values double-quoted with curl's escaping rules."""
    def quote(value: str) -> str:
        if any(c in value for c in "\n\r\x00"):
            raise ValueError("curl config values cannot hold newlines")
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "".join(f"{key} = {quote(value)}\n" for key, value in entries)


def cancellable(command: RemoteCommand, pid_file: str) -> RemoteCommand:
    """Run ``command`` in its own process group whose id goes to ``pid_file``; exit with its status.

    Closing an SSH channel does not stop a remote curl writing to a file, so a killed task could not
    stop it; ``kill_process_group(pid_file)`` can. ``setsid`` does not fork here (a background job
    of a non-interactive shell is no group leader), so the recorded pid is the group id. ``<&0``
    keeps the command's stdin (the secret curl config) instead of bash's /dev/null for ``&``.
    """
    pid = shlex.quote(pid_file)
    return RemoteCommand(
        shell=(
            f'setsid bash -c {shlex.quote(command.shell)} <&0 & pid=$!; echo "$pid" > {pid}; '
            f'wait "$pid"; rc=$?; rm -f -- {pid}; exit "$rc"'
        ),
        description=f"{command.description} (cancellable)",
        stdin=command.stdin,
    )


def kill_process_group(pid_file: str, grace_seconds: int = 5) -> RemoteCommand:
    """Stop what ``cancellable`` started: TERM to its whole process group, KILL what is left after
    ``grace_seconds``; a no-op when it is gone. Returns once the group is gone (or KILLed), so a
    new transfer started next cannot share the old one's .part file with it."""
    pid = shlex.quote(pid_file)
    ticks = int(grace_seconds) * 10
    return RemoteCommand(
        shell=(
            f'if [ -f {pid} ]; then p=$(cat {pid}); case "$p" in (*[!0-9]*|"") exit 0;; '
            # kill -- -0 signals our own group and -1 every process: a corrupt pid file must not.
            f'(0*|1) echo "refusing to signal process group $p from {pid_file}" >&2; exit 1;; esac; '
            # The process too: its pid is written before it has called setsid(), so its group may not exist yet.
            f'kill -TERM -- "-$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; i=0; '
            f'while [ "$i" -lt {ticks} ] && {{ kill -0 -- "-$p" 2>/dev/null || kill -0 "$p" 2>/dev/null; }}; '
            f'do sleep 0.1; i=$((i+1)); done; '
            f'kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; rm -f -- {pid}; fi; exit 0'
        ),
        description=f"stop the process group in {pid_file}",
    )


def download_to_file(presigned_url: str, destination: str) -> RemoteCommand:
    """curl the (secret) URL, given on stdin, to destination via a .part file and rename.

    The rename makes a half-finished download invisible: a retry starts it again from scratch.
    """
    dest, part = shlex.quote(destination), shlex.quote(destination + ".part")
    directory = shlex.quote(destination.rsplit("/", 1)[0] or "/")
    return RemoteCommand(
        shell=(
            f"mkdir -p -- {directory} && "
            f"curl --fail --silent --show-error --location --retry 5 --retry-delay 2 "
            f"--output {part} --config - && mv -f -- {part} {dest}"
        ),
        description=f"download dataset to {destination}",
        stdin=_curl_config([("url", presigned_url)]),
    )


def sha256_of(path: str) -> RemoteCommand:
    return from_argv("sha256sum", "--", path)


def unpack_tar(tar_path: str, destination_dir: str) -> RemoteCommand:
    return from_argv("tar", "-x", "-f", tar_path, "-C", destination_dir, "--no-same-owner",
                      description=f"unpack {tar_path} into {destination_dir}")


def count_files(directory: str, pattern: str) -> RemoteCommand:
    quoted = shlex.quote(directory)
    return RemoteCommand(
        shell=f"find {quoted} -maxdepth 1 -type f -name {shlex.quote(pattern)} | wc -l",
        description=f"count {pattern} in {directory}",
    )


# Manifest names looked for in the unpacked dataset directory, with the tool that checks them.
CHECKSUM_MANIFESTS: tuple[tuple[str, str], ...] = (
    ("SHA256SUMS", "sha256sum"),
    ("sha256sums.txt", "sha256sum"),
    ("MD5SUMS", "md5sum"),
    ("md5sums.txt", "md5sum"),
)


def verify_checksum_manifest(directory: str) -> RemoteCommand:
    """Check the first manifest present; prints ``NO_MANIFEST`` and exits 0 when there is none."""
    quoted = shlex.quote(directory)
    branches = " ".join(
        f"if [ -f {shlex.quote(name)} ]; then echo MANIFEST {shlex.quote(name)}; "
        f"{tool} --check --quiet --strict -- {shlex.quote(name)}; exit $?; fi;"
        for name, tool in CHECKSUM_MANIFESTS
    )
    return RemoteCommand(
        shell=f"cd -- {quoted} && {{ {branches} echo NO_MANIFEST; }}",
        description=f"verify checksum manifest in {directory}",
    )


def modified_times(*paths: str) -> RemoteCommand:
    """``<epoch seconds> <path>`` per file that exists (missing ones are left out, exit 0)."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return RemoteCommand(shell=f"stat -c '%Y %n' -- {quoted} 2>/dev/null; true",
                         description=f"modification times of {len(paths)} file(s)")


def remove_files(*paths: str) -> RemoteCommand:
    return from_argv("rm", "-f", "--", *paths)


# ---------------------------------------------------------------------------------- artifacts


def upload_files(uploads: Sequence[tuple[str, str]], headers: Sequence[tuple[str, str]] = ()) -> RemoteCommand:
    """PUT each local (head-node) file to its presigned URL with one curl; URLs go on stdin.

    Data goes head node -> S3 directly: checkpoints can be large and must not travel through the
    Airflow worker. ``headers`` go with every PUT: a URL presigned with server-side encryption has
    them signed in, and S3 refuses the PUT without them.
    """
    if not uploads:
        raise ValueError("Nothing to upload")
    entries: list[tuple[str, str]] = [("header", f"{name}: {value}") for name, value in headers]
    for local_path, url in uploads:
        entries += [("upload-file", local_path), ("url", url)]
    return RemoteCommand(
        shell="curl --fail --fail-early --silent --show-error --retry 5 --retry-delay 2 --config -",
        description=f"upload {len(uploads)} file(s) with presigned URLs",
        stdin=_curl_config(entries),
    )


# ------------------------------------------------------------------------------ compile cache


def pack_tar(directory: str, tar_path: str) -> RemoteCommand:
    """Tar ``directory``'s content (relative paths) into ``tar_path`` via a .part file and rename;
    prints the archive's size in bytes. An absent or empty directory gives an empty archive."""
    quoted, tar, part = shlex.quote(directory), shlex.quote(tar_path), shlex.quote(tar_path + ".part")
    parent = shlex.quote(tar_path.rsplit("/", 1)[0] or "/")
    return RemoteCommand(
        shell=(f"mkdir -p -- {quoted} {parent} && tar -c -f {part} -C {quoted} . && mv -f -- {part} {tar} "
               f"&& stat -c %s -- {tar}"),
        description=f"pack {directory} into {tar_path}",
    )


# ---------------------------------------------------------------------------------- locks


def take_lock(lock_dir: str, owner: str, stale_after_s: float) -> RemoteCommand:
    """mkdir is atomic on shared storage: exit 0 and the lock is ours (``owner`` written in it), or
    exit 3 and the holder's name on stdout. ``owner`` retakes its own lock (a retry of the task that
    held it); a lock older than ``stale_after_s`` (its holder died) is broken and taken."""
    lock, owner_file = shlex.quote(lock_dir), shlex.quote(lock_dir + "/owner")
    minutes = max(1, int(float(stale_after_s) // 60))
    return RemoteCommand(
        shell=(
            f"mkdir -p -- {shlex.quote(lock_dir.rsplit('/', 1)[0] or '/')} && "
            f"if [ -n \"$(find {lock} -maxdepth 0 -mmin +{minutes} 2>/dev/null)\" ]; then rm -rf -- {lock}; fi; "
            f"if mkdir -- {lock} 2>/dev/null; then printf '%s\\n' {shlex.quote(owner)} > {owner_file}; "
            f"elif [ \"$(cat -- {owner_file} 2>/dev/null)\" = {shlex.quote(owner)} ]; then :; "
            f"else cat -- {owner_file} 2>/dev/null || echo unknown; exit 3; fi"
        ),
        description=f"take the lock {lock_dir}",
    )


def release_lock(lock_dir: str, owner: str) -> RemoteCommand:
    """Remove the lock if ``owner`` holds it (a broken-and-retaken lock is not ours to remove)."""
    lock, owner_file = shlex.quote(lock_dir), shlex.quote(lock_dir + "/owner")
    return RemoteCommand(
        shell=f"if [ \"$(cat -- {owner_file} 2>/dev/null)\" = {shlex.quote(owner)} ]; then rm -rf -- {lock}; fi",
        description=f"release the lock {lock_dir}",
    )
