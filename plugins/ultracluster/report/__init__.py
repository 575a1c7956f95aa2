"""The scaling report: how BERT-Large training time and cost scale with Trn1 nodes, per sweep (titled by
what its runs really trained, and on what: ``hardware``).

- ``records.run_record``: one run of a sweep, from its sweep index entry, state and XComs.
- ``table.build_rows`` / ``table.make_report``: one row per sweep point, efficiency, cost.
- ``render``: Markdown, HTML and JSON; ``plot.plot_png``: the throughput plot (matplotlib, loaded
  only when a plot is drawn).

The task that writes it is ``operators.scaling_report``.
"""
