"""Triggers: the waits, in the triggerer; they report what they saw as ``run.events`` events and decide nothing."""
