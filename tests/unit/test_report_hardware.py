"""Issue 25: a local sweep's report was titled "BERT-Large scaling on Trn1" and plotted against
Neuron's 16-node figures, while its runs trained BERT-tiny on CPU. The report now names what the
runs' results.json say they trained, and on what, in its title, table and plot; the reference points
stand only beside runs of their own model on Trainium. From results.json (as the training program
writes it; tests/training checks the real program's) through collect_results' metrics, the run
record and the report, to the matplotlib figure (its title, labels and series, not its pixels)."""
from __future__ import annotations

import pytest

from ultracluster.report.plot import plot_figure
from ultracluster.report.records import run_record
from ultracluster.report.render import render_markdown, table
from ultracluster.report.table import make_report
from ultracluster.run.contracts import extract_metrics
from ultracluster.run.cost import load_prices

PRICES = load_prices()
POINTS = (1, 2, 3)
TINY = "BERT-tiny (BertForPreTraining, MLM+NSP)"
LARGE = "BERT-large (BertForPreTraining, MLM+NSP)"
NEURON_ENV = {"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1", "PJRT_DEVICE": "NEURON"}


def results_json(nodes: int, avg: float, *, model: str = TINY, device: str = "cpu", env: dict | None = None) -> dict:
    """The parts of results.json the report reads (include/training/dp_bert_large_hf_pretrain_hdf5.py)."""
    def metric(name: str, value: float, units: str) -> dict:
        return {"MetricName": name, "MeasuredValue": value, "Units": units}

    return {"results": {
        "parameters": {"Model": model, "Device": device, "Environment variables": env or {}, "World size": nodes,
                       "Batch size": 8, "Gradient accumulation microsteps": 2, "Number of nodes": nodes,
                       "Scaling mode": "weak", "Total steps": 40, "Start step": 0, "End step": 40},
        "metrics": [metric("Loss", 10.0, ""), metric("Final loss", 9.5, ""), metric("Time to train", 0.3, "minutes"),
                    metric("Average throughput", avg, "seq/s"), metric("Peak throughput", avg * 1.2, "seq/s")]}}


def record(nodes: int, state: str = "success", **results) -> dict:
    """A run of sweep s1 as build_report sees it: its index entry, state and XComs."""
    point = {"id": "s1", "index": POINTS.index(nodes), "count": len(POINTS), "points": list(POINTS),
             "num_nodes": nodes, "scaling_mode": "weak", "chosen_by": "logical_date"}
    plan = {"instance_type": "trn1.32xlarge", "num_nodes": nodes, "scaling_mode": "weak", "sweep_point": point}
    entry = {"dag_id": "trn1_bert_pretrain", "run_id": f"backfill__{nodes}", "point": point, "plan": plan,
             "written_at": f"2026-12-01T10:0{nodes}:00+00:00"}
    xcoms = {"preflight": {"plan": plan}}
    if state == "success":
        xcoms["collect_results"] = extract_metrics(results_json(nodes, 40.0 * nodes, **results), num_nodes=nodes)
    return run_record(entry, state, xcoms)


def report(*records: dict) -> dict:
    return make_report("s1", "trn1_bert_pretrain", POINTS, records, PRICES)


def series(figure) -> dict[str, tuple[list, list]]:
    """Each labelled line of the figure (both y axes): label -> (x data, y data)."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for axes in figure.axes for line in axes.get_lines() if not line.get_label().startswith("_")}


@pytest.mark.parametrize("device, env, expected", [
    ("cpu", {}, "cpu"),
    ("xla", {"PJRT_DEVICE": "CPU"}, "xla:CPU"),        # torch-xla's CPU runtime (the tests' production twin)
    ("xla", NEURON_ENV, "xla:NEURON"),                 # Trainium: torch-xla chose the Neuron PJRT plugin
    ("xla", {}, "xla"),
])
def test_results_json_says_what_trained(device, env, expected):
    metrics = extract_metrics(results_json(2, 80.0, device=device, env=env))
    assert (metrics["model"], metrics["device"]) == ("BERT-tiny", expected)
    bare = extract_metrics({"results": {"parameters": {}, "metrics": []}})
    assert (bare["model"], bare["device"]) == (None, None)


def test_a_local_sweep_names_bert_tiny_on_cpu_without_neurons_figures():
    found = report(record(1), record(2), record(3))
    assert found["title"] == "BERT-tiny scaling on CPU: sweep s1"
    assert (found["model"], found["device"], found["references"]) == ("BERT-tiny", "cpu", [])
    assert found["notes"] == [
        ("the cluster's nodes are trn1.32xlarge instances, but the runs trained on CPU: the cost is priced as "
         "trn1.32xlarge, the throughput is not Trainium's"),
        "no reference points: the published ones are BERT-large on Trainium (Neuron), these runs BERT-tiny on CPU"]

    headers, cells = table(found)
    assert headers[:3] == ["Nodes", "Model", "Device"]
    assert [row[:3] for row in cells] == [[str(n), "BERT-tiny", "CPU"] for n in POINTS]
    markdown = render_markdown(found)
    assert markdown.startswith("# BERT-tiny scaling on CPU: sweep s1\n")
    assert "weak scaling of BERT-tiny on CPU, on trn1.32xlarge nodes" in markdown
    assert "reference" not in "".join(line for line in markdown.splitlines() if line.startswith("| "))

    figure = plot_figure(found)
    axes = figure.axes[0]
    assert axes.get_title() == "Throughput of BERT-tiny on CPU against nodes\nsweep s1 (weak scaling)"
    assert axes.get_xlabel() == "nodes (trn1.32xlarge)" and axes.get_ylabel() == "throughput (sequences/s)"
    lines = series(figure)
    assert sorted(lines) == ["average throughput", "ideal linear (from the 1-node point)", "peak throughput",
                             "weak scaling efficiency"]
    assert lines["average throughput"] == ([1, 2, 3], [40.0, 80.0, 120.0])
    assert lines["ideal linear (from the 1-node point)"][0] == [1, 2, 3]   # no 16-node reference to reach
    assert [text.get_text() for text in axes.get_legend().get_texts()] == [
        "average throughput", "peak throughput", "ideal linear (from the 1-node point)", "weak scaling efficiency"]


def test_bert_large_on_trainium_stands_beside_neurons_reference_points():
    found = report(*(record(n, model=LARGE, device="xla", env=NEURON_ENV) for n in POINTS))
    assert found["title"] == "BERT-large scaling on Trainium (Neuron): sweep s1" and found["notes"] == []
    assert [(ref["label"], ref["nodes"]) for ref in found["references"]] == [
        ("Neuron 2.6 (phase 1)", 16), ("Neuron 2.28 (weak scaling)", 16)]
    _, cells = table(found)
    assert [row[:3] + row[-1:] for row in cells[3:]] == [
        ["16", "BERT-large", "Trainium (Neuron)", "reference: Neuron 2.6 (phase 1)"],
        ["16", "BERT-large", "Trainium (Neuron)", "reference: Neuron 2.28 (weak scaling)"]]

    figure = plot_figure(found)
    assert figure.axes[0].get_title() == (
        "Throughput of BERT-large on Trainium (Neuron) against nodes\nsweep s1 (weak scaling)")
    lines = series(figure)
    assert lines["reference: Neuron 2.6 (phase 1)"] == ([16], [49846])
    assert lines["reference: Neuron 2.28 (weak scaling)"] == ([16], [57408])
    assert lines["ideal linear (from the 1-node point)"][0] == [1, 2, 3, 16]


@pytest.mark.parametrize("results, trained", [
    ({"model": TINY, "device": "xla", "env": NEURON_ENV}, "BERT-tiny on Trainium (Neuron)"),   # another model
    ({"model": LARGE, "device": "xla", "env": {"PJRT_DEVICE": "CPU"}}, "BERT-large on CPU (torch-xla)"),
])
def test_reference_points_need_the_same_model_on_trainium(results, trained):
    found = report(*(record(n, **results) for n in POINTS))
    assert found["references"] == [] and found["title"] == f"{trained.replace(' on ', ' scaling on ', 1)}: sweep s1"
    assert not [label for label in series(plot_figure(found)) if label.startswith("reference")]
    assert found["notes"][-1].startswith("no reference points: the published ones are BERT-large on Trainium")


def test_without_results_the_report_claims_no_model():
    found = report(record(1, "failed"), record(2, "failed"))
    assert found["title"] == "Training scaling: sweep s1" and found["references"] == []
    assert (found["model"], found["device"]) == (None, None)
    assert "weak scaling of no run's results yet, on trn1.32xlarge nodes" in render_markdown(found)
    assert plot_figure(found).axes[0].get_title() == "Throughput against nodes\nsweep s1 (weak scaling)"
