"""The deploy kit: `tether serve --forwarded-allow-ips` makes sign-in work behind a proxy on
another address, and the shipped files (Dockerfile, compose.yaml, deploy/) parse, validate
with `docker compose config` where docker has it, and name only routes and flags that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import tether
from tether.cli import cli
from tether.cli.serve import server_config
from tether.server import create_server
from tether.server.health import HEALTHZ, READYZ
from tether.users import add_user

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = "https://tether.example.com"
PROXY = ("10.0.0.5", 40000)  # an ingress's address: not loopback


async def sign_in_through_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forwarded_allow_ips: str | None
) -> httpx.Response:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    app = tether.App(f"sqlite:///{tmp_path}/p.db")
    await app.open()
    try:
        _, token = await add_user(app.engine, "ada", frozenset({"admin"}))
        server = create_server(app, secret=b"s" * 32, secure_cookies=True, origins=[PUBLIC])
        config = server_config(server, "0.0.0.0", 8000, secure=True,
                               forwarded_allow_ips=forwarded_allow_ips)  # fmt: skip
        config.load()  # wraps the server in uvicorn's proxy-headers middleware, as configured
        transport = httpx.ASGITransport(app=config.loaded_app, client=PROXY)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://tether.example.com"
        ) as http:
            return await http.post(
                "/login", data={"token": token},
                headers={"Origin": PUBLIC, "X-Forwarded-Proto": "https",
                         "X-Forwarded-For": "203.0.113.9"},
            )  # fmt: skip
    finally:
        await app.close()


async def test_sign_in_works_through_a_proxy_named_by_forwarded_allow_ips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = await sign_in_through_proxy(tmp_path, monkeypatch, "10.0.0.0/8")
    assert response.status_code == 303, response.text
    assert "secure" in response.headers["set-cookie"].lower()


async def seen_through_proxy(forwarded_allow_ips: str | None, *, secure: bool) -> Any:
    """The scheme and client an application served by `tether serve`'s uvicorn settings sees
    for a request from PROXY saying X-Forwarded-Proto: https."""

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        body = f"{scope['scheme']} {scope['client'][0]}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    config = server_config(echo, "0.0.0.0", 8000, secure=secure,
                           forwarded_allow_ips=forwarded_allow_ips)  # fmt: skip
    config.load()
    transport = httpx.ASGITransport(app=config.loaded_app, client=PROXY)
    async with httpx.AsyncClient(transport=transport, base_url="http://tether.example.com") as http:
        headers = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
        return (await http.get("/", headers=headers)).text


async def test_forwarded_allow_ips_makes_a_non_loopback_proxy_s_https_believed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    assert await seen_through_proxy("10.0.0.0/8", secure=True) == "https 203.0.113.9"
    assert await seen_through_proxy("10.0.0.5", secure=False) == "https 203.0.113.9"


async def test_without_forwarded_allow_ips_a_non_loopback_proxy_is_not_believed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    assert await seen_through_proxy(None, secure=True) == "http 10.0.0.5"
    assert await seen_through_proxy("192.168.0.0/16", secure=True) == "http 10.0.0.5"


# -- the shipped files ---------------------------------------------------------------------


def load_yaml(path: Path) -> list[Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed: the YAML is not parsed")
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def tether_commands(node: Any) -> list[list[str]]:
    """Every `tether ...` command line held in a YAML document."""
    found: list[list[str]] = []
    if isinstance(node, dict):
        for value in node.values():
            found += tether_commands(value)
    elif isinstance(node, list):
        if node and node[0] == "tether" and all(isinstance(x, str) for x in node):
            found.append(node)
        else:
            for value in node:
                found += tether_commands(value)
    return found


def probe_paths(node: Any) -> list[str]:
    """The paths of every httpGet probe, and every /healthz or /readyz a command names."""
    found: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("httpGet"), dict):
            found.append(node["httpGet"]["path"])
        for value in node.values():
            found += probe_paths(value)
    elif isinstance(node, list):
        for value in node:
            found += probe_paths(value)
    elif isinstance(node, str):
        found += re.findall(r"/(?:healthz|readyz)\b|/[a-z]+z\b", node)
    return found


def check_flags(command: list[str]) -> None:
    """`command` names a tether subcommand and only options its --help lists."""
    assert command[0] == "tether"
    help_text = CliRunner().invoke(cli, [command[1], "--help"])
    assert help_text.exit_code == 0, f"no command `tether {command[1]}`"
    for flag in (word.split("=")[0] for word in command[2:] if word.startswith("--")):
        assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", help_text.output), (
            f"`tether {command[1]}` has no option {flag}"
        )


def test_compose_yaml_runs_postgres_two_workers_and_the_server_with_real_flags() -> None:
    (compose,) = load_yaml(ROOT / "compose.yaml")
    services = compose["services"]
    assert services["postgres"]["image"] == "postgres:15"
    assert "healthcheck" in services["postgres"]
    workers = [s for s in services.values() if s.get("command", [None, None])[1:2] == ["worker"]]
    assert len(workers) == 2
    (server,) = [s for s in services.values() if s.get("command", [None, None])[1:2] == ["serve"]]
    assert "--no-worker" in server["command"]
    commands = tether_commands(compose)
    assert {c[1] for c in commands} == {"worker", "serve", "migrate"}
    for command in commands:
        check_flags(command)
    for service in [*workers, server]:
        assert set(probe_paths(service["healthcheck"])) <= {HEALTHZ, READYZ}
        assert probe_paths(service["healthcheck"])
    for worker in workers:
        assert "--health-port" in worker["command"]
        assert worker["stop_grace_period"]


def test_kubernetes_yaml_probes_the_health_routes_and_leaves_time_to_drain() -> None:
    documents = load_yaml(ROOT / "deploy" / "kubernetes.yaml")
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == ["Deployment", "Deployment", "Job", "Service"]
    for command in tether_commands(documents):
        check_flags(command)
    workers = next(d for d in documents if d["metadata"]["name"] == "tether-worker")
    pod = workers["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 30
    (container,) = pod["containers"]
    assert "--health-port" in container["command"]
    assert container["livenessProbe"]["httpGet"]["path"] == HEALTHZ
    assert container["readinessProbe"]["httpGet"]["path"] == READYZ
    assert set(probe_paths(documents)) == {HEALTHZ, READYZ}


def test_the_systemd_unit_runs_a_worker_with_real_flags_and_a_stop_timeout() -> None:
    unit = (ROOT / "deploy" / "tether-worker.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0].isalpha()
    )
    command = settings["ExecStart"].split()
    assert command[0].endswith("/tether")
    check_flags(["tether", *command[1:]])
    assert command[1] == "worker"
    assert int(settings["TimeoutStopSec"]) >= 30
    assert settings["KillSignal"] == "SIGTERM"


def test_the_dockerfile_installs_the_extras_and_runs_as_a_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert 'pip install ".[server,postgres]"' in text
    (user,) = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user not in ("root", "0")
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.MULTILINE)
    check_flags(json.loads(cmd))


def docker_compose() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_validates_compose_yaml() -> None:
    command = docker_compose()
    if command is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed: not validated")
    result = subprocess.run([*command, "-f", str(ROOT / "compose.yaml"), "config", "--quiet"],
                            capture_output=True, text=True, check=False, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr
