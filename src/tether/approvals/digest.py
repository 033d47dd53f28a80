"""The database's approval key: the secret that keys operation digests and the fingerprints of
masked values, so that neither confirms a guess of a value redaction hid from reviewers.
Generated on first use and kept by the store (Store.database_secret), read once per store.
It never shows, logs or returns the key to anything but the digest and the mask.
"""

from __future__ import annotations

import contextlib
import secrets
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.store.port import Store

NAME = "approvals.digest"

_known: weakref.WeakKeyDictionary[object, bytes] = weakref.WeakKeyDictionary()


async def digest_key(store: Store, now: float) -> bytes:
    """The key of this database's operation digests (32 random bytes, made on first use)."""
    try:
        return _known[store]
    except (KeyError, TypeError):
        pass
    value = await store.database_secret(NAME, secrets.token_hex(32), now)
    key = bytes.fromhex(value)
    with contextlib.suppress(TypeError):  # a store not weakly referable is asked each time
        _known[store] = key
    return key
