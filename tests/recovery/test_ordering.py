"""The pure half of order per key: the book of waiting keys, tokens and partitions."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_retry.recovery.ordering import Block, Deferred, OrderBook, order_token, partition_for


def test_a_key_maps_to_the_same_partition_as_zlib_crc32() -> None:
    assert partition_for("customer-42", 8) == zlib.crc32(b"customer-42") % 8
    assert partition_for("x", 1) == 0
    with pytest.raises(ValueError, match="partitions=0"):
        partition_for("x", 0)


def test_a_token_is_the_message_id_else_a_digest_of_body_and_headers() -> None:
    assert order_token("m-1", b"a", {}) == "id:m-1"
    digest = order_token(None, b"a", {"h": 1})
    assert digest.startswith("sha256:")
    assert order_token(None, b"a", {"h": 1}) == digest
    assert order_token(None, b"a", {"h": 2}) != digest
    assert order_token(None, b"b", {"h": 1}) != digest


def test_a_blocked_key_lets_only_its_blocker_through() -> None:
    book: OrderBook[str] = OrderBook()
    assert not book.must_wait("k", "t1")
    book.block(Block("k", "t1", due_ms=10, seq=1, record="r1"))
    assert not book.must_wait("k", "t1")
    assert book.must_wait("k", "t2")
    assert not book.must_wait("other", "t2")


def test_a_released_key_with_messages_behind_still_makes_new_ones_wait() -> None:
    book: OrderBook[str] = OrderBook()
    book.block(Block("k", "t1", due_ms=10, seq=1, record="r1"))
    book.defer(Deferred("k", "t2", seq=2, record="r2"))
    assert book.next_deferred("k") is None  # blocked: nothing runs yet
    assert book.unblock("k", "other") is None  # only its blocker releases it
    released = book.unblock("k", "t1")
    assert released is not None and released.record == "r1"
    assert book.must_wait("k", "t3")  # t2 runs first
    deferred = book.next_deferred("k")
    assert deferred is not None and deferred.token == "t2"
    book.done(deferred)
    assert not book.must_wait("k", "t3")
    assert book.waiting() == 0


def test_a_later_block_of_a_key_replaces_the_earlier_whatever_order_they_are_read_in() -> None:
    book: OrderBook[str] = OrderBook()
    later = Block("k", "t2", due_ms=20, seq=5, record="r5")
    earlier = Block("k", "t1", due_ms=10, seq=2, record="r2")
    assert book.block(later) == []
    assert book.block(earlier) == [earlier]  # read back out of order: acked, not kept
    assert book.blocks["k"].token == "t2"
    assert book.block(Block("k", "t3", due_ms=30, seq=7, record="r7")) == [later]
    assert book.next_seq() == 8


@given(st.permutations(list(range(1, 20))))
def test_deferred_messages_run_in_sequence_order_whatever_order_they_came_back_in(
    seqs: list[int],
) -> None:
    book: OrderBook[int] = OrderBook()
    for seq in seqs:
        book.defer(Deferred("k", f"t{seq}", seq=seq, record=seq))
    assert book.is_deferred("k", "t3")
    ran = []
    while (deferred := book.next_deferred("k")) is not None:
        ran.append(deferred.seq)
        book.done(deferred)
    assert ran == sorted(seqs)
    assert book.next_seq() == max(seqs) + 1


def test_overdue_keys_are_those_past_their_due_time_and_the_grace() -> None:
    book: OrderBook[str] = OrderBook()
    book.block(Block("a", "t1", due_ms=1_000, seq=1, record="r1"))
    book.block(Block("b", "t2", due_ms=5_000, seq=2, record="r2"))
    assert book.overdue(now_ms=1_500, grace_ms=1_000) == []
    assert book.overdue(now_ms=2_001, grace_ms=1_000) == ["a"]
    assert sorted(book.overdue(now_ms=9_000, grace_ms=1_000)) == ["a", "b"]


def test_ready_keys_are_those_with_messages_waiting_and_no_blocker() -> None:
    book: OrderBook[str] = OrderBook()
    book.block(Block("a", "t1", due_ms=1, seq=1, record="r1"))
    book.defer(Deferred("a", "t2", seq=2, record="r2"))
    book.defer(Deferred("b", "t3", seq=3, record="r3"))
    assert list(book.ready_keys()) == ["b"]
