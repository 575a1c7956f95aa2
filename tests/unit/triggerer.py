"""A trigger as the triggerer runs it: with its task instance (triggers.task_end: only then does a
trigger end its task itself; dag.test() runs triggers inline without one)."""
from __future__ import annotations

from types import SimpleNamespace


def in_triggerer(trigger, task_id: str = "task"):
    trigger.task_instance = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id="manual__2026-12-03T10:00:00+00:00",
                                            task_id=task_id, map_index=-1)
    return trigger
