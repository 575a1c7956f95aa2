"""describe_runtime(): the head node and the compute instances that are up (describe-cluster-instances)."""
from __future__ import annotations

from pathlib import Path

from .nodes import read_node_state
from .procs import pid_alive
from .runtime_state import cluster_paths, load_runtime, runtime_nodes


def describe_runtime(cluster_dir: Path) -> dict:
    paths = cluster_paths(cluster_dir)
    runtime = load_runtime(paths)
    head = runtime["head_node"]
    instances = [{
        "instanceId": head["instance_id"], "instanceType": head["instance_type"],
        "launchTime": head["launch_time"], "privateIpAddress": head["ip"], "publicIpAddress": head["ip"],
        "state": head["state"], "nodeType": "HeadNode",
    }]
    for node in runtime_nodes(runtime):
        state = read_node_state(paths, node.name)
        if state.state == "running" and state.pid and pid_alive(state.pid):
            ec2_state = "running"
        elif state.state == "booting":
            ec2_state = "pending"
        else:
            continue
        instances.append({
            "instanceId": state.instance_id, "instanceType": node.instance_type,
            "launchTime": state.launch_time, "privateIpAddress": node.ip, "publicIpAddress": node.ip,
            "state": ec2_state, "nodeType": "ComputeNode", "queueName": node.queue,
            "poolName": node.resource, "nodeName": node.name,
        })
    return {
        "head_node": {"ip": head["ip"], "ssh_port": head["ssh_port"], "instance_id": head["instance_id"],
                      "launch_time": head["launch_time"], "state": head["state"],
                      "hostname": head["hostname"], "instance_type": head["instance_type"]},
        "instances": instances,
        "slurm": runtime["slurm"],
        "compute_fleet_status": runtime["compute_fleet_status"],
        "ssh_user": runtime["ssh_user"],
    }
