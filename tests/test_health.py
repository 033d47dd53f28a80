"""The probes: GET /healthz and /readyz on `tether serve` (no token, any Host, not in the
OpenAPI document) and on a real `tether worker --health-port` process, over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tests.faults.attack_kit import attack
from tests.server.kit import serving

import tether
from tether.server import create_server
from tether.server.health import probe_server, readiness


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_healthz_and_readyz_answer_ok_without_a_token_on_the_server(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/h.db")
    async with serving(create_server(app)) as live, httpx.AsyncClient(base_url=live.url) as http:
        health = await http.get("/healthz")
        ready = await http.get("/readyz")
        api = await http.get("/api/runs")
    await app.close()
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ok"})
    assert health.headers["x-content-type-options"] == "nosniff"
    assert api.status_code == 401  # the rest is still behind the token


async def test_probes_answer_a_host_that_is_not_the_configured_origin(tmp_path: Path) -> None:
    # The kubelet asks by the pod's address, never by the public name given with --origin.
    app = tether.App(f"sqlite:///{tmp_path}/h.db")
    server = create_server(app, origins=["https://tether.example.com"])
    async with serving(server) as live, httpx.AsyncClient(base_url=live.url) as http:
        ready = await http.get("/readyz", headers={"Host": "10.1.2.3:8000"})
        inbox = await http.get("/", headers={"Host": "10.1.2.3:8000"})
    await app.close()
    assert ready.status_code == 200
    assert inbox.status_code == 400  # the Host check still guards everything else


async def test_readyz_is_503_with_the_reason_when_the_database_does_not_answer(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/h.db")
    async with serving(create_server(app)) as live, httpx.AsyncClient(base_url=live.url) as http:
        await app.close()  # the store is closed under the running server: no answer
        health = await http.get("/healthz")
        ready = await http.get("/readyz")
    assert health.status_code == 200  # the process is still up
    assert ready.status_code == 503
    assert ready.json()["status"] == "unready"
    assert "database did not answer" in ready.json()["reason"]
    assert "h.db" not in ready.text  # nothing about the database to an anonymous caller


async def test_probes_are_not_in_the_openapi_document_and_refuse_other_methods(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/h.db")
    async with serving(create_server(app)) as live, httpx.AsyncClient(base_url=live.url) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
        posted = await http.post("/healthz")
        head = await http.head("/readyz")
    await app.close()
    assert "/healthz" not in paths
    assert "/readyz" not in paths
    assert posted.status_code == 405
    assert posted.headers["allow"] == "GET, HEAD"
    assert (head.status_code, head.content) == (200, b"")


async def test_a_health_port_taken_already_is_a_clear_configuration_error(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/h.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(tether.ConfigurationError, match="--health-port"):
            async with probe_server(app, "127.0.0.1", port):
                pass


WORKER_MODULE = """
import asyncio
from pathlib import Path

import tether

app = tether.App({url!r})

@app.step()
async def slow() -> None:
    Path("started").touch()  # the step is in flight
    await asyncio.sleep(3)

@app.workflow()
async def patient() -> None:
    await slow()
"""


async def probe(url: str) -> tuple[int, int]:
    async with httpx.AsyncClient(base_url=url, timeout=2) as http:
        deadline = time.monotonic() + 20
        while True:
            try:
                health = await http.get("/healthz")
                ready = await http.get("/readyz")
                other = await http.get("/api/runs")
                assert other.status_code == 404
                return health.status_code, ready.status_code
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def start_patient(url: str) -> None:
    app = tether.App(url)

    @app.workflow()
    async def patient() -> None:
        raise AssertionError("this App has no worker")

    await app.start(patient, id="p1")
    await app.close()


async def healthy_while_draining(url: str, proc: subprocess.Popen[str]) -> bool:
    """Whether /healthz answered 200 after SIGTERM, while the worker still drained."""
    async with httpx.AsyncClient(base_url=url, timeout=2) as http:
        while proc.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if (await http.get("/healthz")).status_code == 200 and proc.poll() is None:
                    return True
            await asyncio.sleep(0.05)
    return False


def test_tether_worker_serves_the_probes_on_its_health_port_through_its_drain(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    (tmp_path / "health_worker_mod.py").write_text(WORKER_MODULE.format(url=url))
    asyncio.run(start_patient(url))
    port = free_port()
    command = [sys.executable, "-m", "tether", "worker", "health_worker_mod:app",
               "--health-port", str(port)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        assert asyncio.run(probe(base)) == (200, 200)
        deadline = time.monotonic() + 20
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # the step is in flight: the worker drains
        assert asyncio.run(healthy_while_draining(base, proc))
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"/healthz and /readyz on http://127.0.0.1:{port}/" in out
    assert "stopped" in out
    with socket.socket() as s:  # the port was given back
        s.bind(("127.0.0.1", port))


async def test_only_the_two_exact_probe_paths_skip_the_token_and_the_host_check(
    tmp_path: Path,
) -> None:
    app = tether.App(f"sqlite:///{tmp_path}/h.db")
    server = create_server(app, origins=["https://tether.example.com"])
    async with serving(server) as live, httpx.AsyncClient(base_url=live.url) as http:
        for path in ("/healthz/", "/healthz/../api/runs", "/readyz.json", "/api/healthz",
                     "/HEALTHZ", "/readyz%00"):  # fmt: skip
            with attack("probes"):
                answer = await http.get(path, headers={"Host": "evil.example"})
                assert answer.status_code in (400, 404, 422), (path, answer.status_code)
                assert "status" not in answer.text or "ok" not in answer.text
    await app.close()


async def test_readyz_of_an_unreachable_postgres_never_shows_its_password() -> None:
    pytest.importorskip("psycopg")
    # A port nothing listens on: connecting fails at once, with the URL in the error.
    app = tether.App(f"postgresql://tether:hunter2secret@127.0.0.1:{free_port()}/db")
    with attack("probes"):
        reason = await readiness(app)
        assert reason is not None
        assert "hunter2secret" not in reason
