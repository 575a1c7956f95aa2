"""docker-compose.yaml and the Dockerfile, checked statically: no container engine runs here.

- the compose file is valid against the Compose Specification's JSON schema (vendored, see
  tests/fixtures/compose/README.md), and the validator rejects broken files;
- every build context, Dockerfile and build target exists; every file the Dockerfile copies exists;
- every host path the compose file bind-mounts, and every env_file / secret / config file, exists;
- images are pinned to exact versions, ports are published on 127.0.0.1 only, no secret is written in;
- the Airflow settings that must agree with `make up` (scripts/env.sh) do: auth manager, DAG and
  plugin folders, heartbeat, profile; the ones that differ by design are listed here, and a new
  setting in env.sh must be put in one list or the other;
- the Dockerfile builds on apache/airflow at requirements.txt's Airflow, installs requirements.lock's
  versions and the ultracluster package without dependencies, and the real pcluster in its own venv
  from requirements-pcluster.lock;
- the local-cluster profile's service is privileged and starts the local UltraCluster as
  scripts/up.sh does.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
FIXTURES = REPO / "tests" / "fixtures" / "compose"
SCHEMA_FILE = FIXTURES / "compose-spec.json"
ENV_SH = REPO / "scripts" / "env.sh"

AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                    "airflow-worker", "airflow-init")
LOCAL_CLUSTER = "local-cluster"

# Settings of scripts/env.sh that the compose deployment must share. DAGS_FOLDER and PLUGINS_FOLDER are
# paths, compared by what they point at (test_dag_and_plugin_folders_agree), the rest by value.
MUST_AGREE = {
    "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__PLUGINS_FOLDER",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL",
    "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
    "AIRFLOW__AWS__SESSION_FACTORY",
    "ULTRACLUSTER_PROFILE",
}
# Settings of scripts/env.sh that differ in compose by design, and why.
DIFFER_BY_DESIGN = {
    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor with Redis, not LocalExecutor",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": "the postgres service, its URL in the secrets volume",
    "AIRFLOW__API__HOST": "0.0.0.0 in the container (Airflow's default); published on 127.0.0.1 only",
    "AIRFLOW__API__PORT": "8080 in the container; AIRFLOW_PORT picks the published port",
    "AIRFLOW__API__BASE_URL": "the published port",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "the api-server's service name",
    "AIRFLOW__CORE__PARALLELISM": "Airflow's default: make up's 6 fits its 2-core machine",
    "AIRFLOW__API__WORKERS": "Airflow's default",
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "Airflow's default (1 s): production waits last minutes, a "
                                                     "shorter idle loop only costs the database queries",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": "in the secrets volume (generated, as make up does)",
}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET|_KEY$|SQL_ALCHEMY_CONN|RESULT_BACKEND|BROKER_URL|TOKEN", re.I)


# --- helpers (the negative tests run them on broken copies) ---------------------------------------------

def load_compose(path: Path = COMPOSE_FILE) -> dict:
    return yaml.safe_load(path.read_text())


def schema_errors(compose: dict) -> list[str]:
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(compose)]


def env_of(service: dict) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) if "=" in item else (item, "") for item in environment)
    return {k: "" if v is None else str(v) for k, v in environment.items()}


def default_of(value: str) -> str:
    """A compose/shell value with ${VAR:-default} / ${VAR-default} resolved to its default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def volume_specs(service: dict) -> list[dict]:
    """Short and long volume syntax, as {type, source, target}."""
    specs = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            parts = volume.split(":")
            source, target = (parts[0], parts[1]) if len(parts) > 1 else (None, parts[0])
            kind = "bind" if source and (source.startswith((".", "/", "~", "$"))) else "volume"
            specs.append({"type": kind, "source": source, "target": target})
        else:
            specs.append({"type": volume.get("type", "volume"), "source": volume.get("source"),
                          "target": volume["target"]})
    return specs


def missing_host_files(compose: dict, base: Path = REPO) -> list[str]:
    """Bind-mount sources, env_files, build contexts/Dockerfiles, secret and config files that do not exist."""
    missing = []
    for name, service in compose["services"].items():
        for spec in volume_specs(service):
            if spec["type"] == "bind" and not (base / default_of(spec["source"])).exists():
                missing.append(f"{name}: bind mount {spec['source']}")
        env_files = service.get("env_file") or []
        for env_file in [env_files] if isinstance(env_files, str) else env_files:
            path = env_file if isinstance(env_file, str) else env_file["path"]
            required = True if isinstance(env_file, str) else env_file.get("required", True)
            if required and not (base / path).exists():
                missing.append(f"{name}: env_file {path}")
        build = service.get("build")
        if build:
            build = {"context": build} if isinstance(build, str) else build
            context = base / build.get("context", ".")
            if not context.is_dir():
                missing.append(f"{name}: build context {build.get('context')}")
            elif "dockerfile_inline" not in build and not (context / build.get("dockerfile", "Dockerfile")).is_file():
                missing.append(f"{name}: Dockerfile {build.get('dockerfile', 'Dockerfile')}")
    for section in ("secrets", "configs"):
        for name, item in (compose.get(section) or {}).items():
            if item and "file" in item and not (base / item["file"]).exists():
                missing.append(f"{section}.{name}: file {item['file']}")
    return missing


def non_loopback_ports(compose: dict) -> list[str]:
    bad = []
    for name, service in compose["services"].items():
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                host_ip = port.get("host_ip")
            else:
                parts = default_of(str(port)).split(":")
                host_ip = parts[0] if len(parts) == 3 else None
            if host_ip != "127.0.0.1":
                bad.append(f"{name}: {port}")
    return bad


def literal_secrets(compose: dict) -> list[str]:
    """Environment values of secret-looking settings that are written in rather than read from a file
    (_CMD, *_FILE) or required from the environment (${VAR:?message})."""
    bad = []
    for name, service in compose["services"].items():
        for key, value in env_of(service).items():
            if not SECRET_NAME.search(key) or key.endswith(("_CMD", "_FILE")):
                continue
            if key == "AIRFLOW__CELERY__BROKER_URL" and "@" not in value:
                continue   # a broker URL without credentials
            if value and not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?\?[^}]*\}", value):
                bad.append(f"{name}: {key}={value}")
        text = json.dumps(service)
        if re.search(r"airflow:airflow@", text):
            bad.append(f"{name}: the airflow:airflow default credentials")
    return bad


def unpinned_images(compose: dict) -> list[str]:
    bad = []
    for name, service in compose["services"].items():
        image = service.get("image")
        if not image or "build" in service:
            continue   # built here: the Dockerfile's FROM is checked instead
        tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?(-[a-z0-9.]+)?(@sha256:[0-9a-f]{64})?", tag):
            bad.append(f"{name}: {image}")
    return bad


def env_sh_exports() -> dict[str, str]:
    """`export NAME=VALUE` lines of scripts/env.sh, ${VAR:-default} resolved to the default and
    $repo / $AIRFLOW_HOME left as they are."""
    exports = {}
    for line in ENV_SH.read_text().splitlines():
        match = re.match(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if match:
            (value,) = shlex.split(match.group(2)) or [""]
            exports[match.group(1)] = default_of(value)
    return exports


def airflow_default(section: str, key: str) -> str:
    from airflow.configuration import conf
    return conf.get_default_value(section, key)


def dockerfile_stages() -> dict[str, list[str]]:
    """Instructions per stage (continuation lines joined), keyed by stage name."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if match:
            current = match.group(2) or match.group(1)
            stages[current] = [line]
        elif current:
            stages[current].append(line)
    return stages


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


# --- the schema ----------------------------------------------------------------------------------------

def test_vendored_schema_is_the_recorded_one():
    digest = hashlib.sha256(SCHEMA_FILE.read_bytes()).hexdigest()
    assert digest in (FIXTURES / "README.md").read_text(), "compose-spec.json changed: update its README"
    assert (FIXTURES / "LICENSE").read_text().lstrip().startswith("Apache License")
    jsonschema.Draft7Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


def test_compose_file_is_valid_against_the_compose_spec(compose):
    assert schema_errors(compose) == []


@pytest.mark.parametrize("breakage, expected", [
    (lambda c: c["services"]["airflow-worker"].update(comand="celery worker"), "comand"),
    (lambda c: c["services"]["airflow-apiserver"]["depends_on"]["airflow-init"].update(condition="done"), "done"),
    (lambda c: c["services"]["postgres"].update(restart=5), "services/postgres/restart"),
    (lambda c: c.update(service={}), "service"),
])
def test_the_schema_check_catches_a_broken_compose_file(compose, breakage, expected):
    broken = copy.deepcopy(compose)
    breakage(broken)
    errors = schema_errors(broken)
    assert errors and any(expected in e for e in errors), errors


# --- what it builds, mounts and reads ----------------------------------------------------------------------

def test_services(compose):
    services = compose["services"]
    for name in ("postgres", "redis", *AIRFLOW_SERVICES, LOCAL_CLUSTER):
        assert name in services
    assert env_of(services["airflow-worker"])["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert services["airflow-apiserver"]["command"] == "api-server"
    assert services["airflow-scheduler"]["command"] == "scheduler"
    assert services["airflow-dag-processor"]["command"] == "dag-processor"
    assert services["airflow-triggerer"]["command"].startswith("triggerer")
    assert services["airflow-worker"]["command"].startswith("celery worker")
    init = "\n".join(services["airflow-init"]["command"])
    assert "airflow db migrate" in init
    # what scripts/airflow.sh sets up besides the migration
    assert "pools set ultracluster_cluster_admission 1" in init
    assert "pools set ultracluster_cluster_admission 1" in (REPO / "scripts" / "airflow.sh").read_text()
    for name in AIRFLOW_SERVICES:
        assert services[name].get("healthcheck") or name == "airflow-init", name


def test_build_contexts_dockerfiles_and_targets_exist(compose):
    assert missing_host_files(compose) == []
    stages = dockerfile_stages()
    built = [s for s in compose["services"].values() if "build" in s]
    assert built
    for service in built:
        assert service["build"]["target"] in stages


def test_every_mounted_or_read_host_file_exists(compose):
    assert missing_host_files(compose) == []
    binds = {default_of(spec["source"]) for s in compose["services"].values() for spec in volume_specs(s)
             if spec["type"] == "bind"}
    assert binds == {"./dags", "./include"}, "a new bind mount: check it is in the repo or made by a documented step"
    # named volumes are declared
    for name, service in compose["services"].items():
        for spec in volume_specs(service):
            if spec["type"] == "volume" and spec["source"]:
                assert spec["source"] in compose.get("volumes", {}), f"{name}: volume {spec['source']}"


def test_the_file_check_catches_a_missing_file(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["airflow-scheduler"]["volumes"] = ["./no-such-dir:/opt/x:ro"]
    broken["services"]["airflow-scheduler"]["env_file"] = ["no-such.env"]
    broken["services"]["airflow-worker"]["build"] = {"context": ".", "dockerfile": "Dockerfile.missing"}
    missing = missing_host_files(broken)
    assert any("no-such-dir" in m for m in missing)
    assert any("no-such.env" in m for m in missing)
    assert any("Dockerfile.missing" in m for m in missing)


def test_every_file_the_dockerfile_copies_exists_and_is_not_ignored():
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    sources = []
    for instructions in dockerfile_stages().values():
        for line in instructions:
            if line.upper().startswith("COPY"):
                args = [a for a in line.split()[1:] if not a.startswith("--")]
                sources += args[:-1]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        top = source.rstrip("/").split("/")[0]
        assert top not in ignored and source.rstrip("/") not in ignored, f"{source} is in .dockerignore"


# --- the guide: pins, loopback, secrets -----------------------------------------------------------------

def test_images_are_pinned_exactly(compose):
    assert unpinned_images(compose) == []
    broken = copy.deepcopy(compose)
    broken["services"]["redis"]["image"] = "redis:latest"
    broken["services"]["postgres"]["image"] = "postgres:16"
    assert len(unpinned_images(broken)) == 2


def test_ports_are_published_on_loopback_only(compose):
    assert compose["services"]["airflow-apiserver"]["ports"]
    assert non_loopback_ports(compose) == []
    broken = copy.deepcopy(compose)
    broken["services"]["redis"]["ports"] = ["6379:6379"]
    broken["services"]["postgres"]["ports"] = [{"target": 5432, "published": "5432", "host_ip": "0.0.0.0"}]
    assert len(non_loopback_ports(broken)) == 2


def test_no_secret_is_written_into_the_compose_file(compose):
    assert literal_secrets(compose) == []
    assert not re.search(r"airflow:airflow|_AIRFLOW_WWW_USER_PASSWORD", COMPOSE_FILE.read_text())
    broken = copy.deepcopy(compose)
    env = broken["services"]["postgres"]["environment"]
    env["POSTGRES_PASSWORD"] = "airflow"
    broken["services"]["airflow-worker"]["environment"]["AIRFLOW__CORE__FERNET_KEY"] = "abc="
    assert len(literal_secrets(broken)) == 2


def test_secrets_are_generated_and_read_from_files(compose):
    services = compose["services"]
    script = "\n".join(services["airflow-secrets"]["command"])
    common = env_of(services["airflow-scheduler"])
    read = {key: value for key, value in common.items() if key.endswith("_CMD")}
    assert set(read) >= {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD", "AIRFLOW__CORE__FERNET_KEY_CMD",
                         "AIRFLOW__API_AUTH__JWT_SECRET_CMD", "AIRFLOW__API__SECRET_KEY_CMD"}
    for value in read.values():
        path = value.removeprefix("cat ")
        assert path.startswith("/opt/airflow/secrets/")
        assert f'"$$d/{Path(path).name}"' in script, f"{path} is not generated by airflow-secrets"
    assert f'"$$d/{Path(common["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).name}"' in script
    assert "/dev/urandom" in script
    pg = env_of(services["postgres"])
    assert Path(pg["POSTGRES_PASSWORD_FILE"]).name == "postgres_password" and '"$$d/postgres_password"' in script
    assert services["postgres"]["depends_on"]["airflow-secrets"]["condition"] == "service_completed_successfully"


# --- settings shared with make up ----------------------------------------------------------------------------

def test_every_env_sh_airflow_setting_is_classified():
    exports = env_sh_exports()
    airflow_settings = {k for k in exports if k.startswith("AIRFLOW__")} | {"ULTRACLUSTER_PROFILE"}
    unclassified = airflow_settings - MUST_AGREE - set(DIFFER_BY_DESIGN)
    assert not unclassified, f"scripts/env.sh sets {sorted(unclassified)}: add them to MUST_AGREE or DIFFER_BY_DESIGN"


@pytest.mark.parametrize("service", [*AIRFLOW_SERVICES, LOCAL_CLUSTER])
def test_settings_agree_with_make_up(compose, service):
    exports = env_sh_exports()
    env = {k: default_of(v) for k, v in env_of(compose["services"][service]).items()}
    for key in sorted(MUST_AGREE - {"AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER"}):
        if key in exports:
            expected = exports[key]
        else:   # make up leaves it to Airflow's default
            section, option = key.removeprefix("AIRFLOW__").lower().split("__", 1)
            expected = airflow_default(section, option)
        assert env.get(key) == expected, f"{service}: {key} is {env.get(key)!r}, make up's is {expected!r}"


def test_dag_and_plugin_folders_agree(compose):
    exports = env_sh_exports()
    # make up: DAGs from the repo's dags/, and a plugins folder that is not the repo's plugins/ (the
    # package is installed; loading it from a folder too would load it twice).
    assert exports["AIRFLOW__CORE__DAGS_FOLDER"] == "$repo/dags"
    assert not exports["AIRFLOW__CORE__PLUGINS_FOLDER"].startswith("$repo")
    for name in (*AIRFLOW_SERVICES, LOCAL_CLUSTER):
        service = compose["services"][name]
        env = env_of(service)
        mounts = {spec["target"].rstrip("/"): spec["source"] for spec in volume_specs(service)}
        assert mounts.get(env["AIRFLOW__CORE__DAGS_FOLDER"]) == "./dags", name
        plugins = env["AIRFLOW__CORE__PLUGINS_FOLDER"]
        assert plugins not in mounts, f"{name}: something is mounted on the plugins folder"
        assert env["ULTRACLUSTER_INCLUDE_DIR"] in mounts and mounts[env["ULTRACLUSTER_INCLUDE_DIR"]] == "./include"
    # the image's own defaults say the same
    image_env = " ".join(dockerfile_stages()["ultracluster"])
    assert "AIRFLOW__CORE__DAGS_FOLDER=/opt/ultracluster/dags" in image_env
    assert "COPY --chown=airflow:0 dags/ /opt/ultracluster/dags/" in image_env
    assert "AIRFLOW__CORE__PLUGINS_FOLDER=/opt/airflow/plugins" in image_env
    assert "ULTRACLUSTER_INCLUDE_DIR=/opt/ultracluster/include" in image_env


def test_what_differs_by_design_does_differ(compose):
    env = env_of(compose["services"]["airflow-scheduler"])
    exports = env_sh_exports()
    assert exports["AIRFLOW__CORE__EXECUTOR"] == "ultracluster.executor.PreloadedLocalExecutor"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    assert "AIRFLOW__API__HOST" not in env
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:")


def test_profile_and_queues(compose):
    """The profile defaults to make up's; tasks go to the queue named after it; the local-cluster service
    serves `local`, airflow-worker and airflow-triggerer serve `production`."""
    services = compose["services"]
    make_up_profile = env_sh_exports()["ULTRACLUSTER_PROFILE"]
    assert make_up_profile == "local"
    env = env_of(services["airflow-scheduler"])
    assert env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] == env["ULTRACLUSTER_PROFILE"] == "${ULTRACLUSTER_PROFILE:-local}"
    assert env["AIRFLOW__TRIGGERER__QUEUES_ENABLED"] == "True"
    assert services["airflow-worker"]["command"] == "celery worker --queues production"
    assert services["airflow-triggerer"]["command"] == "triggerer --queues production"
    local = "\n".join(services[LOCAL_CLUSTER]["command"])
    assert "airflow triggerer --queues local" in local and "airflow celery worker --queues local" in local
    assert env_of(services[LOCAL_CLUSTER])["ULTRACLUSTER_PROFILE"] == "local"
    for name in ("production", "local"):
        assert (REPO / "include" / "profiles" / f"{name}.json").is_file()


# --- the Dockerfile ------------------------------------------------------------------------------------------

def test_dockerfile_builds_on_the_airflow_of_requirements_txt():
    stages = dockerfile_stages()
    airflow_pin = re.search(r"^apache-airflow==(\S+)$", (REPO / "requirements.txt").read_text(), re.M).group(1)
    assert stages["ultracluster"][0] == f"FROM apache/airflow:{airflow_pin}-python3.11 AS ultracluster"
    assert re.search(rf"^apache-airflow=={re.escape(airflow_pin)}$", (REPO / "requirements.lock").read_text(), re.M)
    assert stages["local-cluster"][0] == "FROM ultracluster AS local-cluster"


def test_dockerfile_installs_the_lock_and_the_package_without_deps():
    runs = [line for line in dockerfile_stages()["ultracluster"] if line.startswith("RUN")]
    lock = [r for r in runs if "requirements.lock" in r]
    assert lock and all(("-c /opt/ultracluster/requirements.lock" in r or "--no-deps" in r) for r in lock)
    assert any(re.search(r"pip install .*--no-deps /opt/ultracluster/plugins\b", r) for r in runs)


def test_the_pcluster_venv_is_built_from_its_lock():
    runs = " ".join(line for line in dockerfile_stages()["ultracluster"] if line.startswith("RUN"))
    assert "python -m venv /opt/pcluster-venv" in runs
    assert re.search(r"/opt/pcluster-venv/bin/pip install [^&]*--no-deps -r /opt/ultracluster/requirements-pcluster.lock", runs)
    # the path the docs' pcluster_default connection names
    assert "/opt/pcluster-venv/bin/pcluster" in (REPO / "docs" / "operations.md").read_text()


# --- the local-cluster profile ----------------------------------------------------------------------------

def test_local_cluster_is_one_privileged_service_started_as_make_up_starts_it(compose):
    service = compose["services"][LOCAL_CLUSTER]
    assert service["profiles"] == ["local-cluster"]
    assert service["privileged"] is True
    assert service["user"] == "0:0"
    assert service["build"]["target"] == "local-cluster"
    assert [n for n, s in compose["services"].items() if "local-cluster" in (s.get("profiles") or [])] == [LOCAL_CLUSTER]
    script = "\n".join(service["command"])
    up_sh = (REPO / "scripts" / "up.sh").read_text()
    # scripts/up.sh: `local-ultracluster up --endpoint "$AWS_ENDPOINT_URL" --dataset-tar <the dataset tar>`
    assert re.search(r'local-ultracluster" up --endpoint "\$AWS_ENDPOINT_URL"', up_sh)
    assert 'local-ultracluster up --endpoint "$$AWS_ENDPOINT_URL" --dataset-tar' in script
    dataset = re.search(r"--dataset-tar \"\$LOCAL_ULTRACLUSTER_HOME/dataset/(\S+\.tar)\"", up_sh).group(1)
    assert dataset.startswith(re.search(r'dataset_name="(\S+)"', (REPO / "scripts" / "build_local_dataset.sh").read_text()).group(1))
    assert "build_local_dataset.sh" in script
    # the connections `up` writes, sourced as scripts/env.sh sources them
    assert '. "$$LOCAL_ULTRACLUSTER_HOME/airflow.env"' in script and "set -a" in script
    assert '. "$LOCAL_ULTRACLUSTER_HOME/airflow.env"' in ENV_SH.read_text()
    env = env_of(service)
    assert env["AWS_ENDPOINT_URL"] == env_sh_exports()["AWS_ENDPOINT_URL"]
    assert env["LOCAL_ULTRACLUSTER_HOME"] == env_sh_exports()["LOCAL_ULTRACLUSTER_HOME"]
    assert "ports" not in service and "network_mode" not in service


def test_local_cluster_image_installs_from_the_repo_files():
    stage = " ".join(dockerfile_stages()["local-cluster"])
    assert "bash /opt/ultracluster/scripts/setup_apt.sh" in stage
    assert "-r /opt/ultracluster/localcluster/requirements.lock" in stage
    assert "scripts/setup_training_venv.sh" in stage
    # the venv the local cluster's compute nodes see as their Neuron venv (LOCAL_UC_TRAINING_VENV)
    assert "TRAINING_VENV_DIR=/opt/ultracluster/venvs/training" in stage
    assert "LOCAL_UC_TRAINING_VENV=/opt/ultracluster/venvs/training" in stage


def test_the_deployment_is_documented():
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert "docs/deploy.md" in (REPO / "README.md").read_text()
    assert "docs/deploy.md" in (REPO / "docs" / "operations.md").read_text()
    assert "Not exercised here" in deploy and "--profile local-cluster" in deploy
    for topic in ("/opt/pcluster-venv/bin/pcluster", "AWS credentials", "SSH key", "ULTRACLUSTER_PROFILE=production"):
        assert topic in deploy, topic
