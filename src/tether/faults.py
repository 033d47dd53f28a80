"""Named fault sites at the engine's commit boundaries, for crash and fault tests only.

Disabled unless $TETHER_FAULTS is set when this module is first imported; the hot path then
pays one boolean test. Spec: comma-separated `site[@label-pattern]=action`, where action is
`kill` (SIGKILL this process), `raise` (raise InjectedFault) or `stall:SECONDS`. Never set it in
production.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from dataclasses import dataclass


class InjectedFault(Exception):
    """A fault injected through $TETHER_FAULTS; only tests see this."""


@dataclass(frozen=True, slots=True)
class _Rule:
    site: str
    label: str | None
    action: str


def _parse(spec: str) -> list[_Rule]:
    rules = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        target, _, action = part.partition("=")
        site, _, label = target.partition("@")
        rules.append(_Rule(site, label or None, action or "kill"))
    return rules


_RULES = _parse(os.environ.get("TETHER_FAULTS", ""))
ENABLED = bool(_RULES)


def hit(site: str, label: str = "") -> None:
    """Act on the first rule matching this site and label; a no-op when faults are disabled."""
    if not ENABLED:
        return
    for rule in _RULES:
        if rule.site == site and (rule.label is None or fnmatch.fnmatchcase(label, rule.label)):
            if rule.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif rule.action == "raise":
                raise InjectedFault(f"injected fault at {site} ({label})")
            elif rule.action.startswith("stall:"):
                time.sleep(float(rule.action.split(":", 1)[1]))
            return
