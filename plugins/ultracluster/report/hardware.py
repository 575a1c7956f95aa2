"""What a sweep's runs trained, and on what: the model and the device their results.json names
(``run.contracts.model_name`` and ``device_of``), as the report's title, table and plot name them,
and the published reference points (prices.json) that may stand beside them: only those of the same
model on the same device and instance type (Neuron's figures: BERT-large on Trainium).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TRAINIUM = "xla:NEURON"
DEVICE_LABELS = {"cpu": "CPU", "cuda": "GPU (CUDA)", TRAINIUM: "Trainium (Neuron)", "xla:CPU": "CPU (torch-xla)"}


def device_label(device: str | None) -> str | None:
    """``xla:NEURON`` -> ``Trainium (Neuron)``; another XLA device -> ``XLA (TPU)``; None stays None."""
    if not device:
        return None
    if device in DEVICE_LABELS:
        return DEVICE_LABELS[device]
    kind, _, pjrt = device.partition(":")
    return f"XLA ({pjrt})" if kind == "xla" and pjrt else device.upper()


def trained(model: str | None, device: str | None) -> str | None:
    """``BERT-tiny on CPU``; what is known of it, or None."""
    return " on ".join(part for part in (model, device_label(device)) if part) or None


def title(sweep_id: str, model: str | None, device: str | None) -> str:
    """``BERT-tiny scaling on CPU: sweep s1``, leaving out what no run reported."""
    on = f" on {device_label(device)}" if device else ""
    return f"{model or 'Training'} scaling{on}: sweep {sweep_id}"


def _same(a: str | None, b: str | None) -> bool:
    return bool(a and b) and str(a).lower() == str(b).lower()


def references(prices: Mapping[str, Any], model: str | None, device: str | None,
               instance_type: str | None) -> list[dict[str, Any]]:
    """The reference points of ``prices`` that compare with these runs: same model, device and
    instance type; none for runs whose model or device is unknown."""
    return [dict(ref) for ref in prices.get("references") or []
            if _same(ref.get("model"), model) and ref.get("device") == device
            and ref.get("instance_type") == instance_type]


def notes(prices: Mapping[str, Any], model: str | None, device: str | None, instance_type: str | None,
          *, mixed: Sequence[str] = ()) -> list[str]:
    """What the reader must know to compare: runs that trained different things (``mixed``: ``model``
    or ``device``), training that did not use the instance type's Trainium devices, and why the
    published points are left out."""
    lines = [f"the runs trained different {what}s: the title names the most common" for what in mixed]
    if device and device != TRAINIUM and str(instance_type or "").startswith("trn"):
        lines.append(f"the cluster's nodes are {instance_type} instances, but the runs trained on "
                     f"{device_label(device)}: the cost is priced as {instance_type}, the throughput is not Trainium's")
    published = [ref for ref in prices.get("references") or [] if ref.get("instance_type") == instance_type]
    if published and not references(prices, model, device, instance_type):
        them = sorted({trained(ref.get("model"), ref.get("device")) or "?" for ref in published})
        lines.append(f"no reference points: the published ones are {', '.join(them)}, these runs "
                     f"{trained(model, device) or 'reported neither model nor device'}")
    return lines
