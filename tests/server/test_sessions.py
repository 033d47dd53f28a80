"""Inbox sessions and sign-in limits, piece by piece: a request moves a session's last-seen time
(at most once per TOUCH_SECONDS), live-stream polls do not, the throttle forgets failures once
they leave its window, and `tether serve` refuses settings that would make it weak."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from starlette.requests import Request
from tests.server.kit import Person, sign_in

import tether
from tether.cli import cli
from tether.server.auth import SESSION_COOKIE
from tether.server.throttle import Throttle


def seen(app: tether.App) -> list[float]:
    path = Path(app.url.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT seen_at FROM tether_sessions")]


def age(app: tether.App, seconds: float) -> None:
    path = Path(app.url.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE tether_sessions SET seen_at = seen_at - ?", (seconds,))


async def test_a_page_request_counts_as_activity_and_a_live_poll_does_not(
    app: tether.App, server: FastAPI, client: httpx.AsyncClient, alice: Person
) -> None:
    await sign_in(client, alice)
    [first] = seen(app)
    assert (await client.get("/")).status_code == 200
    assert seen(app) == [first]  # within TOUCH_SECONDS: not written again
    age(app, 120)
    cookie = f"{SESSION_COOKIE}={client.cookies[SESSION_COOKIE]}".encode()
    poll = Request({"type": "http", "headers": [(b"cookie", cookie)]})  # as /live polls
    assert await server.state.auth.session(poll, touch=False) is not None
    assert seen(app) == [first - 120]  # a poll is not activity
    assert (await client.get("/runs")).status_code == 200
    assert seen(app)[0] > first - 120  # a page is


async def test_a_session_idle_past_its_limit_is_over_even_with_a_page_open(
    app: tether.App, client: httpx.AsyncClient, alice: Person
) -> None:
    await sign_in(client, alice)
    age(app, 30 * 60 + 1)
    assert 'action="/login"' in (await client.get("/")).text


def test_the_throttle_refuses_after_the_limit_and_forgets_failures_leaving_its_window() -> None:
    now = [1000.0]
    throttle = Throttle(3, 60.0, clock=lambda: now[0])
    assert [throttle.failed("a") for _ in range(3)] == [False, False, True]
    assert throttle.wait("a") == 60
    assert throttle.wait("b") == 0  # per address
    now[0] += 59.5
    assert throttle.wait("a") == 1
    now[0] += 0.5
    assert throttle.wait("a") == 0  # the failures left the window


def test_the_throttle_remembers_a_bounded_number_of_addresses() -> None:
    throttle = Throttle(1, 60.0, clock=lambda: 0.0, max_clients=2)
    for client in ("a", "b", "c"):
        throttle.failed(client)
    assert (throttle.wait("a"), throttle.wait("b"), throttle.wait("c")) == (0, 60, 60)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--secure-cookies"], {}, "--origin https://"),
        (["--origin", "tether.example.com"], {}, "not an origin"),
        ([], {"TETHER_SESSION_SECRET": "0123456789abcdef"}, "at least 32"),
    ],
    ids=["secure-without-origin", "origin-without-scheme", "short-secret"],
)
def test_tether_serve_refuses_weak_settings_before_it_starts(
    args: list[str], env: dict[str, str], says: str
) -> None:
    result = CliRunner().invoke(cli, ["serve", "nowhere:app", *args], env=env)
    assert result.exit_code != 0
    assert says in result.output
