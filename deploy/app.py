"""The application the deploy kit runs (Dockerfile, compose.yaml, deploy/): one workflow of two
steps, enough to see a run go from `tether runs` to a worker and back. Replace it with yours.

Its database comes from $TETHER_DATABASE_URL, as every `tether` command's does; `python
app.py NAME` starts a run of `hello` for the workers and prints its id.
"""

from __future__ import annotations

import tether

app = tether.App()


@app.step()
async def greet(name: str) -> str:
    return f"hello {name}"


@app.step()
async def shout(text: str) -> str:
    return text.upper()


@app.workflow()
async def hello(name: str) -> str:
    return await shout(await greet(name))


async def _start(name: str) -> None:
    await app.open()  # opening only: the workers, not this process, execute the run
    try:
        handle = await app.start(hello, name)
        print(handle.id)
    finally:
        await app.close()


if __name__ == "__main__":  # `python app.py ada`: start a run of hello and print its id
    import asyncio
    import sys

    asyncio.run(_start(sys.argv[1] if len(sys.argv) > 1 else "world"))
