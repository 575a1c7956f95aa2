"""ultracluster: run BERT pretraining on AWS Trn1 UltraClusters from Airflow.

Keep this module import-free: the DAG file imports subpackages at parse time.
"""

__version__ = "0.1.0"
