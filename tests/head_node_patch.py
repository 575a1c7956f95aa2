"""Swap the head node of every operator module for a test's own (a local shell, a replay)."""
from __future__ import annotations

import importlib
import pkgutil

import ultracluster.operators


def operator_modules_with(name: str) -> list:
    modules = [importlib.import_module(f"ultracluster.operators.{info.name}")
               for info in pkgutil.iter_modules(ultracluster.operators.__path__)]
    return [module for module in modules if hasattr(module, name)]


def use_head_node(monkeypatch, shell) -> None:
    """Every ``HeadNodeHook(...)`` an operator builds is ``shell``."""
    for module in operator_modules_with("HeadNodeHook"):
        monkeypatch.setattr(module, "HeadNodeHook", lambda **_: shell)
