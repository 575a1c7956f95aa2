"""Parse cost of dags/trn1_bert_pretrain.py as a ratio against a bare DAG, measured in the same run.

Each sample is a fresh interpreter that imports airflow.sdk (paid by both) and pre-imports the
file's ``airflow.*`` imports as the DAG processor's parent does (parsing_pre_import_modules), then
times only the import of the DAG file: the cost every parse pays. Run: .venvs/airflow/bin/python bench/dag_parse.py [--samples N]
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
BARE_DAG = '''
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
with DAG("bare", schedule=None):
    EmptyOperator(task_id="a") >> EmptyOperator(task_id="b")
'''
PROBE = '''
import importlib, importlib.util, sys, time
import airflow.sdk  # noqa: F401 - baseline cost shared by both files
from airflow.utils.file import iter_airflow_imports
for name in iter_airflow_imports(sys.argv[1]):  # the DAG processor pre-imports these once, in its parent
    importlib.import_module(name)
t = time.perf_counter()
spec = importlib.util.spec_from_file_location("dag_under_test", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(time.perf_counter() - t)
'''


def sample(path: pathlib.Path) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bare = pathlib.Path(tmp, "bare_dag.py")
        bare.write_text(BARE_DAG)
        dag = REPO / "dags" / "trn1_bert_pretrain.py"
        bare_s, dag_s = [], []
        for _ in range(args.samples):  # interleaved, so drift hits both alike
            bare_s.append(sample(bare))
            dag_s.append(sample(dag))
    b, d = statistics.median(bare_s), statistics.median(dag_s)
    print(f"bare DAG parse      median {b * 1000:8.1f} ms  (n={args.samples})")
    print(f"trn1_bert_pretrain  median {d * 1000:8.1f} ms  (n={args.samples})")
    print(f"ratio               {d / b:8.2f} x bare")


if __name__ == "__main__":
    main()
