"""The scaling report: how BERT-Large training time and cost scale with Trn1 nodes, per sweep.

- ``records.run_record``: one run of a sweep, from its sweep index entry, state and XComs.
- ``table.build_rows`` / ``table.make_report``: one row per sweep point, efficiency, cost.
- ``render``: Markdown, self-contained HTML, JSON; ``plot.plot_png``: the throughput plot.
- ``operator.ScalingReportOperator``: the Airflow task (S3 in, S3 out, an Asset event).

Everything but ``operator`` and ``plot`` is pure and stdlib only. Nothing heavy is imported here:
the report DAG imports the operator at parse time.
"""
