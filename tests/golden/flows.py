"""Workflows whose recorded histories are kept in this folder: the current code must keep
replaying them (except the one recorded from an older, incompatible version of `order`)."""

from __future__ import annotations

from dataclasses import dataclass

import tether


@dataclass
class Parcel:
    order_id: str
    carrier: str


def register(app: tether.App, *, order_version: int = 2) -> None:
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
