"""The run core: what a run *is*, in the stdlib only.

Names, the plan and its rules, the form's constants, sweeps and their index, every cluster, stack,
fleet and job state with its verdict, trigger events, the checkpoint and results contracts, tags,
cost, the compile-cache key, profiles, S3 URIs and their encryption, the Neuron versions, and what a
healthy node has (the node health gate).

Every layer imports this package; it imports none of them (docs/architecture.md).
"""
