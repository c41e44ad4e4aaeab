"""Scale-out files (infra/compose.yaml, infra/helm/*.yaml): they parse, hang together, and every
Prefect setting, plug-in module and CLI command they name exists in the installed Prefect 3.9.1
and prefect-redis. (Docker and Kubernetes are not available here, so nothing is started.)"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.local_cluster import (
    SERVER_ENV_FILE,
    WORKER_ENV_FILE,
    ClusterError,
    read_env_file,
    server_addresses,
)

INFRA = Path(__file__).resolve().parents[1] / "infra"
COMPOSE = INFRA / "compose.yaml"
HELM = sorted((INFRA / "helm").glob("*.yaml"))


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@cache
def _valid_prefect_env_names() -> frozenset[str]:
    """Every environment variable name a setting of Prefect or prefect-redis answers to."""
    import prefect_redis
    from prefect.settings import Settings
    from prefect.settings.base import PrefectBaseSettings
    from prefect.settings.legacy import _get_valid_setting_names

    names = set(_get_valid_setting_names(Settings))
    for module_info in pkgutil.iter_modules(prefect_redis.__path__):
        module = importlib.import_module(f"prefect_redis.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, PrefectBaseSettings) and cls.__module__ == module.__name__:
                names |= _get_valid_setting_names(cls)
    return frozenset(names)


def _compose_env(service: dict[str, Any]) -> dict[str, str]:
    """What compose gives the container: its ``env_file`` lines, then ``environment`` over them."""
    files = service.get("env_file") or []
    merged: dict[str, str] = {}
    for name in [files] if isinstance(files, str) else files:
        merged.update(read_env_file(INFRA / name))
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return merged | {str(k): str(v) for k, v in env.items()}


def _helm_env(values: Any) -> dict[str, str]:
    """Every {name, value} pair in any env list of a values file."""
    found: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("env", "extraEnvVars") and isinstance(value, list):
                    for item in value:
                        found[item["name"]] = str(item.get("value", ""))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(values)
    return found


def _all_env() -> list[tuple[str, str, str]]:
    rows = []
    for name, service in _load(COMPOSE)["services"].items():
        rows += [(f"compose:{name}", k, v) for k, v in _compose_env(service).items()]
    for path in HELM:
        rows += [(path.name, k, v) for k, v in _helm_env(_load(path)).items()]
    return rows


def test_settings_enumeration_knows_nested_and_plugin_names() -> None:
    """The checker itself: known names are in, a misspelt one is out."""
    names = _valid_prefect_env_names()
    assert "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE" in names  # nested server model
    assert "PREFECT_REDIS_MESSAGING_HOST" in names  # prefect-redis settings
    assert "PREFECT_MESSAGING_BROKER" in names
    assert "PREFECT_SERVER_CONCURENCY_LEASE_STORAGE" not in names


def test_every_prefect_env_var_is_a_real_setting() -> None:
    names = _valid_prefect_env_names()
    unknown = [f"{where}: {name}" for where, name, _ in _all_env() if name.startswith("PREFECT_")]
    unknown = [line for line in unknown if line.split(": ")[1] not in names]
    assert unknown == []
    assert len([1 for _, name, _ in _all_env() if name.startswith("PREFECT_")]) > 30


# Setting -> how Prefect checks the module it names (the same protocols Prefect uses at start).
def _broker(module: Any) -> bool:
    from prefect.server.utilities.messaging import BrokerModule

    return isinstance(module, BrokerModule)


def _cache(module: Any) -> bool:
    from prefect.server.utilities.messaging import CacheModule

    return isinstance(module, CacheModule)


def _ordering(module: Any) -> bool:
    from prefect.server.events.ordering import CausalOrderingModule

    return isinstance(module, CausalOrderingModule)


def _leases(module: Any) -> bool:
    from prefect.server.concurrency.lease_storage import ConcurrencyLeaseStorageModule

    return isinstance(module, ConcurrencyLeaseStorageModule)


def _cleanup(module: Any) -> bool:
    from prefect.server.worker_communication.cleanup_queue import WorkerCleanupQueue

    cls = getattr(module, "WorkerCleanupQueue", None)
    return isinstance(cls, type) and issubclass(cls, WorkerCleanupQueue)


MODULE_SETTINGS = {
    "PREFECT_MESSAGING_BROKER": _broker,
    "PREFECT_MESSAGING_CACHE": _cache,
    "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": _ordering,
    "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": _leases,
    "PREFECT_SERVER_WORKER_CHANNEL_CLEANUP_QUEUE_STORAGE": _cleanup,
}


def test_redis_plugins_are_configured_everywhere_and_import() -> None:
    server_env = [
        ("compose", _compose_env(_load(COMPOSE)["services"][name]))
        for name in ("prefect-api-1", "prefect-api-2", "prefect-services", "migrate")
    ] + [("helm", _helm_env(_load(INFRA / "helm" / "prefect-server-values.yaml")))]
    for where, env in server_env:
        for setting, fits in MODULE_SETTINGS.items():
            assert env.get(setting, "").startswith("prefect_redis."), f"{where}: {setting}"
            module = importlib.import_module(env[setting])
            assert fits(module), f"{where}: {setting}={env[setting]} is not what Prefect loads"
        assert env["PREFECT_SERVER_DOCKET_URL"].startswith("redis://"), where


def test_compose_services_present_and_consistent() -> None:
    compose = _load(COMPOSE)
    services = compose["services"]
    for name in ("postgres", "redis", "migrate", "prefect-api-1", "prefect-api-2",
                 "prefect-services", "prefect-api", "worker"):  # fmt: skip
        assert name in services, name
    for name, service in services.items():
        for target in service.get("depends_on") or {}:
            assert target in services, f"{name} depends on unknown {target}"
    prefect = ["migrate", "prefect-api-1", "prefect-api-2", "prefect-services", "worker"]
    assert len({services[name]["image"] for name in prefect}) == 1  # one image, one version
    server_envs = [_compose_env(services[n]) for n in prefect[:4]]
    assert all(env == server_envs[0] for env in server_envs)  # the same server settings
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["prefect-api-1"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    for name in ("prefect-api-2", "prefect-services"):  # after the first replica, not with it
        assert services[name]["depends_on"]["prefect-api-1"]["condition"] == "service_healthy"
    assert server_envs[0]["PREFECT_SERVER_DATABASE_MIGRATE_ON_START"] == "false"
    assert services["worker"]["deploy"]["replicas"] >= 1
    upstreams = re.findall(r"server (\S+):4200;", (INFRA / "nginx.conf").read_text())
    assert upstreams == ["prefect-api-1", "prefect-api-2"]
    assert _compose_env(services["worker"])["PREFECT_API_URL"] == "http://prefect-api:4200/api"
    for name in compose.get("volumes", {}):
        assert any(
            str(v).startswith(f"{name}:") for s in services.values() for v in s.get("volumes", [])
        ), f"volume {name} unused"


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        ("migrate", {"yes": True}),
        ("prefect-api-1", {"no_services": True}),
        ("prefect-api-2", {"no_services": True}),
        ("prefect-services", {}),
        ("worker", {"work_pool_name": "collector", "worker_type": "process"}),
    ],
)
def test_compose_commands_are_real_prefect_cli_commands(
    service: str, expected: dict[str, Any]
) -> None:
    """Parsed by Prefect's own CLI (cyclopts), without running them."""
    import prefect.cli  # noqa: F401  (registers the commands)
    from prefect.cli._app import _app

    argv = _load(COMPOSE)["services"][service]["command"]
    assert argv[0] == "prefect"
    _, bound, _ = _app.parse_args(argv[1:], exit_on_error=False, print_error=False)
    assert dict(bound.arguments) == expected


def test_helm_values_shape() -> None:
    server = _load(INFRA / "helm" / "prefect-server-values.yaml")
    worker = _load(INFRA / "helm" / "prefect-worker-values.yaml")
    assert server["server"]["replicaCount"] >= 2
    assert server["backgroundServices"]["runAsSeparateDeployment"] is True
    assert server["global"]["prefect"]["image"] == {
        key: worker["worker"]["image"][key] for key in ("repository", "prefectTag")
    }
    assert (
        worker["worker"]["config"] | {"type": "process", "workPool": "collector"}
        == (worker["worker"]["config"])
    )
    assert worker["worker"]["apiConfig"] == "server"


def test_no_literal_secrets() -> None:
    """Passwords come from Secrets (helm) or the environment (compose), never the files."""
    secretish = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY", re.I)
    for where, name, value in _all_env():
        if secretish.search(name):
            assert where.startswith("compose:") and value.startswith("${"), (where, name)
        for url in re.findall(r"\w+://[^\s]+", value):
            if "@" in url:  # credentials in a URL: only as an environment reference
                assert re.match(r"\w+(\+\w+)?://\w+:\$\{\w+(:-\w+)?\}@", url), (where, name)


def test_image_pins_the_prefect_version_the_project_pins() -> None:
    import prefect

    dockerfile = (INFRA / "Dockerfile").read_text()
    assert f"FROM prefecthq/prefect:{prefect.__version__}-python3.11" in dockerfile


# --- one source of truth for the settings -------------------------------------------------------
ADDRESS_KEYS = set(
    server_addresses(
        database_url="", redis_host="", redis_port=0, api_host="", api_port=0, ui_api_url=""
    )
)


def test_compose_server_processes_get_exactly_the_env_file_plus_addresses() -> None:
    shared = read_env_file(SERVER_ENV_FILE)
    assert not ADDRESS_KEYS & set(shared)  # the file holds no address
    services = _load(COMPOSE)["services"]
    for name in ("migrate", "prefect-api-1", "prefect-api-2", "prefect-services"):
        assert services[name]["env_file"] == "prefect-server.env", name
        env = _compose_env(services[name])
        assert {k: env[k] for k in shared} == shared, name  # nothing overrides the file
        assert set(env) - set(shared) == ADDRESS_KEYS, name
    worker = services["worker"]
    assert worker["env_file"] == "prefect-worker.env"
    worker_env = _compose_env(worker)
    assert set(read_env_file(WORKER_ENV_FILE).items()) <= set(worker_env.items())


def test_helm_server_env_is_exactly_the_env_file_plus_addresses() -> None:
    shared = read_env_file(SERVER_ENV_FILE)
    values = _load(INFRA / "helm" / "prefect-server-values.yaml")
    names = [item["name"] for item in values["global"]["prefect"]["env"]]
    assert len(names) == len(set(names))
    env = _helm_env(values)  # every env list in the file, so a per-component override shows too
    assert {k: env.get(k) for k in shared} == shared
    # the database URL comes from the chart's Secret, the listen address from the chart
    assert set(env) - set(shared) <= ADDRESS_KEYS


def test_helm_worker_settings_are_the_worker_env_file() -> None:
    shared = read_env_file(WORKER_ENV_FILE)
    worker = _load(INFRA / "helm" / "prefect-worker-values.yaml")["worker"]
    config = {  # the chart turns these into the worker's settings
        "PREFECT_WORKER_QUERY_SECONDS": str(worker["config"]["queryInterval"]),
        "PREFECT_WORKER_PREFETCH_SECONDS": str(worker["config"]["prefetchSeconds"]),
    }
    env = config | {item["name"]: str(item["value"]) for item in worker["extraEnvVars"]}
    assert {k: env.get(k) for k in shared} == shared


def test_the_checks_above_see_a_drift(tmp_path: Path) -> None:
    """A changed value or a misspelt line in an env file is caught."""
    drifted = tmp_path / "drift.env"
    drifted.write_text(SERVER_ENV_FILE.read_text().replace("=WARNING", "=INFO"))
    values = _load(INFRA / "helm" / "prefect-server-values.yaml")
    shared = read_env_file(drifted)
    assert {k: _helm_env(values).get(k) for k in shared} != shared
    drifted.write_text("PREFECT_SERVER_LOGGING_LEVEL: WARNING\n")
    with pytest.raises(ClusterError, match=r"drift\.env:1: expected KEY=VALUE"):
        read_env_file(drifted)


def test_local_cluster_nginx_conf_is_the_compose_one_repointed(tmp_path: Path) -> None:
    from infra.local_cluster import NGINX_SERVER_CONF, _nginx_conf

    conf = _nginx_conf(tmp_path, 4300, [4301, 4302], tmp_path / "access.log")
    assert re.findall(r"server (\S+);", conf) == ["127.0.0.1:4301", "127.0.0.1:4302"]
    assert "listen 127.0.0.1:4300;" in conf
    for line in NGINX_SERVER_CONF.read_text().splitlines():  # every other line as compose has it
        if line.strip() and "server prefect-api" not in line and "listen" not in line:
            assert line in conf, line


def test_local_cluster_commands_parse() -> None:
    from infra.local_cluster import main

    with pytest.raises(SystemExit) as exit_info:
        main(["up", "--workers", "-1", "--dir", "/nonexistent"])
    assert exit_info.value.code == 2
    assert main(["status", "--dir", "/nonexistent/cluster"]) == 1  # no cluster: one line, exit 1
