"""Operators: one task each, thin and typed; each module is one step of the DAG (docs/architecture.md)."""
