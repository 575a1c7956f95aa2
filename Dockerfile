# syntax=docker/dockerfile:1
# The ultracluster images for docker-compose.yaml (docs/deploy.md). Everything installs from the repo's
# own pins, as scripts/setup_venvs.sh does for `make up`.
#
#   target ultracluster   Airflow 3.3.2 + requirements.lock + the ultracluster package, and the real
#                         ParallelCluster CLI in its own venv (/opt/pcluster-venv)
#   target local-cluster  that, plus the local UltraCluster (Slurm, munge, sshd, moto) and the training
#                         venv: the compose profile `local-cluster` (not built or run by CI)

FROM apache/airflow:3.3.2-python3.11 AS ultracluster

# Airflow's environment: requirements.txt's packages at requirements.lock's versions. The lock also pins
# the test tools (requirements-dev.txt); a constraint installs only what requirements.txt asks for.
# requirements.txt pins apache-airflow==3.3.2, so the image's Airflow stays the one it was built with.
COPY --chown=airflow:0 requirements.txt requirements.lock /opt/ultracluster/
RUN pip install --no-cache-dir -r /opt/ultracluster/requirements.txt -c /opt/ultracluster/requirements.lock

# The product: the ultracluster package (hooks, operators, triggers; an Airflow provider through its
# entry point), without dependencies: they are the lock's, installed above.
COPY --chown=airflow:0 plugins/ /opt/ultracluster/plugins/
RUN pip install --no-cache-dir --no-deps /opt/ultracluster/plugins

# The real pcluster cannot share Airflow's environment (jsii pins attrs<24, the task SDK needs
# attrs>=24.2): its own venv, from requirements-pcluster.lock, with Node.js for create-cluster.
# Production names /opt/pcluster-venv/bin/pcluster in the pcluster_default connection.
USER root
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends nodejs \
 && rm -rf /var/lib/apt/lists/*
COPY requirements-pcluster.lock /opt/ultracluster/
# PIP_USER: the image installs Airflow with pip's --user; a venv's pip must not.
RUN python -m venv /opt/pcluster-venv \
 && PIP_USER=false /opt/pcluster-venv/bin/pip install --no-cache-dir --no-deps -r /opt/ultracluster/requirements-pcluster.lock \
 && /opt/pcluster-venv/bin/pcluster version
USER airflow

# DAGs and include/ (templates, profiles, training files). The package is installed, not in a source
# tree, so ULTRACLUSTER_INCLUDE_DIR says where include/ is. The plugins folder stays Airflow's empty
# one: the package registers itself, and loading it from a folder as well would load it twice.
COPY --chown=airflow:0 include/ /opt/ultracluster/include/
COPY --chown=airflow:0 dags/ /opt/ultracluster/dags/
# The commit trn1_build_image tags the node image with (the image has no .git):
# docker compose build --build-arg ULTRACLUSTER_COMMIT=$(git rev-parse HEAD)
ARG ULTRACLUSTER_COMMIT=""
ENV ULTRACLUSTER_COMMIT=${ULTRACLUSTER_COMMIT} \
    ULTRACLUSTER_INCLUDE_DIR=/opt/ultracluster/include \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/ultracluster/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/airflow/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False


FROM ultracluster AS local-cluster
# The local UltraCluster, installed the way `make setup` installs it: Debian's packages from
# scripts/setup_apt.sh (the base image is Debian 12, like make up's machine), the localcluster venv
# from localcluster/requirements.lock, the training venv from include/training/requirements.txt.
# It runs as root: the daemons need their own namespaces (docs/local-cluster.md).
USER root
COPY scripts/setup_apt.sh scripts/setup_training_venv.sh scripts/build_local_dataset.sh /opt/ultracluster/scripts/
RUN bash /opt/ultracluster/scripts/setup_apt.sh && rm -rf /var/lib/apt/lists/*
COPY localcluster/ /opt/ultracluster/localcluster/
RUN python -m venv /opt/ultracluster/venvs/localcluster \
 && PIP_USER=false /opt/ultracluster/venvs/localcluster/bin/pip install --no-cache-dir --no-deps -r /opt/ultracluster/localcluster/requirements.lock \
 && PIP_USER=false /opt/ultracluster/venvs/localcluster/bin/pip install --no-cache-dir --no-deps /opt/ultracluster/localcluster
# The CPU build of torch that include/training/requirements.txt pins (2.13.0+cpu) is on PyTorch's CPU
# index, not on PyPI.
RUN PIP_USER=false PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    TRAINING_VENV_DIR=/opt/ultracluster/venvs/training \
    bash /opt/ultracluster/scripts/setup_training_venv.sh
# Airflow runs as root in here: PYTHONUSERBASE lets root's Python see the packages installed for the
# `airflow` user, while the venvs (pcluster, localcluster, training) never see them.
ENV PYTHONUSERBASE=/home/airflow/.local \
    LOCAL_ULTRACLUSTER_HOME=/var/lib/local-ultracluster \
    AWS_ENDPOINT_URL=http://127.0.0.1:5055 \
    AWS_DEFAULT_REGION=us-east-1 \
    TRAINING_PYTHON=/opt/ultracluster/venvs/training/bin/python \
    LOCAL_UC_TRAINING_VENV=/opt/ultracluster/venvs/training
