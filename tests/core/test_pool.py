"""IdlePool: the clients a Python worker keeps between tasks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from connectors.core.pool import IdlePool


@dataclass(eq=False)
class Client:
    name: str
    ok: bool = True
    closed: bool = False

    def close(self) -> None:
        self.closed = True


def _pool(max_idle: int = 2, idle_seconds: float = 60) -> IdlePool[Client]:
    return IdlePool("client", idle_seconds=idle_seconds, max_idle=max_idle,
                    usable=lambda c: c.ok and not c.closed, close=Client.close)


def test_a_client_given_back_serves_the_next_take_of_its_key_only() -> None:
    pool = _pool()
    a = Client("a")
    pool.give_back("k1", a)
    assert pool.take("k2") is None
    assert pool.take("k1") is a
    assert pool.take("k1") is None
    assert not a.closed


def test_the_newest_client_is_taken_first_and_a_full_key_closes_the_oldest() -> None:
    pool = _pool(max_idle=2)
    a, b, c = Client("a"), Client("b"), Client("c")
    for client in (a, b, c):
        pool.give_back("k", client)
    assert a.closed and not b.closed and not c.closed
    assert pool.take("k") is c
    assert pool.take("k") is b


def test_an_unusable_client_is_closed_on_the_way_in_and_on_the_way_out() -> None:
    pool = _pool()
    broken = Client("broken", ok=False)
    pool.give_back("k", broken)
    assert broken.closed and pool.take("k") is None
    later = Client("later")
    pool.give_back("k", later)
    later.ok = False  # e.g. the server closed the idle session
    assert pool.take("k") is None
    assert later.closed


def test_a_client_idle_too_long_is_closed_instead_of_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("connectors.core.pool.time.monotonic", lambda: now[0])
    pool = _pool(idle_seconds=60)
    old = Client("old")
    pool.give_back("k", old)
    now[0] += 61
    assert pool.take("k") is None
    assert old.closed


def test_clear_closes_every_idle_client_and_counts_them() -> None:
    pool = _pool()
    clients = [Client(str(i)) for i in range(3)]
    pool.give_back("a", clients[0])
    pool.give_back("b", clients[1])
    pool.give_back("b", clients[2])
    assert pool.clear() == 3
    assert all(c.closed for c in clients)
    assert pool.take("b") is None


def test_keys_are_digests_that_never_hold_a_secret() -> None:
    key = IdlePool.key("postgresql://app:s3cret@db/prod", "30s")
    assert "s3cret" not in key and len(key) == 64
    assert key == IdlePool.key("postgresql://app:s3cret@db/prod", "30s")
    assert key != IdlePool.key("postgresql://app:other@db/prod", "30s")
    assert "s3cret" not in repr(_pool())
