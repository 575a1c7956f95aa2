"""`python -m localcluster.runtime provision SPEC_JSON CLUSTER_DIR | teardown CLUSTER_DIR | describe
CLUSTER_DIR | fleet CLUSTER_DIR STATUS | stop-everything HOME | faults CLUSTER_DIR KNOB [NODE[:always] ...]`:
prints JSON; exit 1 on failure. `faults` replaces a running cluster's node fault targets (node_faults.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..spec import ClusterSpec
from . import describe_runtime, node_faults, provision, set_compute_fleet, stop_everything, teardown
from .errors import RuntimeProvisionError
from .runtime_state import cluster_paths, load_runtime, runtime_nodes


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    try:
        if command == "provision":
            spec = ClusterSpec.from_dict(json.loads(Path(args[0]).read_text()))
            result: object = provision(spec, Path(args[1]))
        elif command == "teardown":
            teardown(Path(args[0]))
            result = {"torn_down": args[0]}
        elif command == "describe":
            result = describe_runtime(Path(args[0]))
        elif command == "fleet":
            result = {"status": set_compute_fleet(Path(args[0]), args[1])}
        elif command == "faults":
            paths = cluster_paths(Path(args[0]))
            nodes = [n.name for n in runtime_nodes(load_runtime(paths))]
            result = {"knob": args[1], "targets": node_faults.set_targets(paths, args[1], args[2:], nodes)}
        elif command == "stop-everything":
            result = {"stopped": stop_everything(Path(args[0]))}
        else:
            print(f"unknown command {command}", file=sys.stderr)
            return 2
    except (RuntimeProvisionError, RuntimeError, ValueError, OSError) as exc:
        print(json.dumps({"message": str(exc)}), file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
