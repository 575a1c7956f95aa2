"""ultracluster: run BERT pretraining on AWS Trn1 UltraClusters from Airflow.

Import-free: every module is imported by its own name (docs/architecture.md has the map).
"""

__version__ = "0.1.0"
