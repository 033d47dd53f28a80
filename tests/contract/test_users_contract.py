"""The Store contract for the server's users, run once per backend (see conftest).

put_user inserts or replaces by name, get_user and user_by_token read by name and by token hash
(revoked users too), list_users orders by name, revoke_user keeps the first revocation time.
Same rules as test_store_contract: plain float times, nothing sleeps, exact answers.
"""

from __future__ import annotations

import hashlib

from tests.contract.test_store_contract import NOW

from tether.store.port import Store
from tether.store.port.users import UserRecord


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def user(
    name: str,
    token: str | None = None,
    groups: tuple[str, ...] = (),
    created_at: float = NOW,
    revoked_at: float | None = None,
) -> UserRecord:
    return UserRecord(name, groups, token_hash(token or f"token-{name}"), created_at, revoked_at)


async def test_put_user_stores_a_user_read_back_by_name_and_by_token_hash(store: Store) -> None:
    alice = user("alice", groups=("finance", "ops"), created_at=NOW + 0.25)
    await store.put_user(alice)
    assert await store.get_user("alice") == alice
    assert await store.user_by_token(token_hash("token-alice")) == alice
    assert await store.list_users() == [alice]


async def test_put_user_with_an_existing_name_replaces_the_whole_user(store: Store) -> None:
    await store.put_user(user("alice", "old", ("finance",)))
    await store.put_user(user("bob"))
    await store.revoke_user("alice", NOW + 1)
    replaced = user("alice", "new", ("ops", "audit"), created_at=NOW + 5)
    await store.put_user(replaced)
    assert await store.get_user("alice") == replaced  # a new token, new groups, not revoked
    assert await store.user_by_token(token_hash("new")) == replaced
    assert await store.user_by_token(token_hash("old")) is None  # the old token is gone
    assert await store.list_users() == [replaced, user("bob")]


async def test_unknown_names_and_token_hashes_give_none_and_write_nothing(store: Store) -> None:
    assert await store.get_user("nobody") is None
    assert await store.user_by_token(token_hash("nothing")) is None
    assert await store.revoke_user("nobody", NOW) is None
    assert await store.list_users() == []
    await store.put_user(user("alice"))
    assert await store.get_user("Alice") is None  # names are exact
    assert await store.user_by_token(token_hash("token-bob")) is None
    assert await store.revoke_user("bob", NOW) is None
    assert await store.list_users() == [user("alice")]


async def test_list_users_gives_every_user_by_name(store: Store) -> None:
    for name in ("carol", "alice", "dave", "bob"):
        await store.put_user(user(name, groups=(f"g-{name}",)))
    listed = await store.list_users()
    assert [u.name for u in listed] == ["alice", "bob", "carol", "dave"]
    assert listed == [user(n, groups=(f"g-{n}",)) for n in ("alice", "bob", "carol", "dave")]


async def test_revoke_user_marks_the_user_revoked_and_keeps_the_first_revocation_time(
    store: Store,
) -> None:
    alice, bob = user("alice", groups=("finance",)), user("bob")
    await store.put_user(alice)
    await store.put_user(bob)
    revoked = UserRecord("alice", ("finance",), alice.token_hash, NOW, revoked_at=NOW + 1.5)
    assert await store.revoke_user("alice", NOW + 1.5) == revoked
    assert await store.revoke_user("alice", NOW + 9) == revoked  # the first time stays
    # Revoked users are still found, by name and by token, and listed.
    assert await store.get_user("alice") == revoked
    assert await store.user_by_token(alice.token_hash) == revoked
    assert await store.list_users() == [revoked, bob]
    assert await store.get_user("bob") == bob  # the others are left as they are
