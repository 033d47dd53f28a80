"""Workflows whose recorded histories are kept in this folder: the current code must keep
replaying them (except the one recorded from an older, incompatible version of `order`).
`survey` runs branches, children and waits concurrently; its branches finish in another order
than they start, so its history holds them in completion order, not in call order."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import tether


@dataclass
class Parcel:
    order_id: str
    carrier: str


def register(app: tether.App, *, order_version: int = 2, survey_version: int = 1) -> None:
    @app.step()
    async def reserve(order_id: str) -> dict[str, object]:
        return {"order_id": order_id, "reserved": True}

    @app.step()
    async def charge(order_id: str, amount: int) -> str:
        return f"charge-{order_id}-{amount}"

    @app.step()
    def ship(order_id: str) -> Parcel:
        return Parcel(order_id, "post")

    @app.step(retry=tether.NO_RETRY)
    async def lookup(key: str) -> str:
        raise LookupError(f"no {key}")

    if order_version == 1:

        @app.workflow(name="order")
        async def order_v1(order_id: str, amount: int) -> dict[str, object]:
            # Version 1 charged before reserving: version 2 swapped them.
            receipt = await charge(order_id, amount)
            await reserve(order_id)
            parcel = await ship(order_id)
            return {"receipt": receipt, "carrier": parcel.carrier}

    else:

        @app.workflow(name="order")
        async def order(order_id: str, amount: int) -> dict[str, object]:
            await reserve(order_id)
            receipt = await charge(order_id, amount)
            parcel = await ship(order_id)
            return {"receipt": receipt, "carrier": parcel.carrier}

    @app.workflow()
    async def greet(name: str) -> dict[str, object]:
        at = tether.now()
        token = tether.uuid4()
        try:
            await lookup(name)
        except LookupError:
            found = False
        return {"at": at.isoformat(), "token": str(token), "found": found}

    @app.workflow()
    async def batch(n: int) -> int:
        total = 0
        for i in range(n):
            reserved = await reserve(f"item-{i}")
            total += 1 if reserved["reserved"] else 0
        return total

    @app.step()
    async def measure(region: str, delay_ms: int) -> int:
        await asyncio.sleep(delay_ms / 1000)
        return len(region) * 10 + delay_ms

    @app.workflow()
    async def tally(region: str) -> int:
        await tether.sleep(timedelta(milliseconds=10))
        return await measure(region, 0)

    @app.workflow()
    async def survey(regions: list[str]) -> dict[str, object]:
        async def branch(region: str, delay_ms: int) -> dict[str, object]:
            # The first branch sleeps longest: the branches finish in reverse order.
            first = await measure(region, delay_ms + (survey_version == 0))
            token = tether.uuid4()
            second = await measure(f"{region}!", 0)
            return {"region": region, "total": first + second, "token": str(token)}

        slow_first = [(len(regions) - i) * 40 for i in range(len(regions))]
        branches = await asyncio.gather(*map(branch, regions, slow_first))
        async with asyncio.TaskGroup() as group:
            kids = [group.create_task(tally(region)) for region in regions]
        heard = await asyncio.gather(
            tether.wait_for_event("left", timeout=timedelta(milliseconds=120)),
            tether.wait_for_event("right", timeout=timedelta(milliseconds=60)),
        )
        return {"branches": list(branches), "tallies": [k.result() for k in kids],
                "heard": list(heard)}  # fmt: skip
