"""Failed sign-ins and bad bearer tokens, counted per client address: after LIMIT failures within
WINDOW seconds the address's failures are answered 429 (with Retry-After) until the oldest
leaves the window. A valid token still passes (tokens carry 256 random bits, so an answer to a
guess is worth nothing), so that one guesser behind a shared address locks nobody else out.

In memory, per process: a restart forgets, and each process behind a load balancer counts
alone. Successes are neither counted nor slowed. It knows nothing of HTTP or of users.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

LIMIT = 10
WINDOW = 60.0
MAX_CLIENTS = 10_000  # addresses remembered; the quietest are forgotten first


class Throttle:
    def __init__(
        self,
        limit: int = LIMIT,
        window: float = WINDOW,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times

    def wait(self, client: str) -> int:
        """Seconds before `client` may try again (0: now), rounded up for Retry-After."""
        now = self.clock()
        times = self._recent(client, now)
        if times is None or len(times) < self.limit:
            return 0
        return max(1, math.ceil(times[-self.limit] + self.window - now))

    def failed(self, client: str) -> bool:
        """Count a failure of `client`; whether this one reached the limit (to log it once)."""
        now = self.clock()
        times = self._recent(client, now)
        if times is None:
            times = self._failures[client] = deque(maxlen=self.limit)
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)
        self._failures.move_to_end(client)
        times.append(now)
        return len(times) == self.limit
