"""How a batch's records the server did not run go round again (`Connection._rounds`): only
those, inline, after a backoff, each answer in its record's place; a batch that stays busy,
or that comes back with fewer answers than it sent, is a StorageError naming the store. No
server needed: the sender here answers as the client would (its batch records' result codes),
so these run in CI; tests/stores/test_aerospike_batch.py sends real batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from stores.errors import StorageError
from stores.utxo.aerospike import client

BUSY = 14  # KEY_BUSY


@dataclass
class Answer:
    result: int
    index: int


class Server:
    """Answers each item with OK, or busy for as many rounds as `busy[i]` says."""

    def __init__(self, busy: dict[int, int]) -> None:
        self.busy = dict(busy)
        self.rounds: list[tuple[list[int], bool | None]] = []

    def send(self, todo: list[int], policy: dict[str, Any], inline: bool | None) -> list[Answer]:
        assert policy == {"max_retries": 0}
        self.rounds.append((list(todo), inline))
        out = []
        for i in todo:
            if self.busy.get(i, 0) > 0:
                self.busy[i] -= 1
                out.append(Answer(BUSY, i))
            else:
                out.append(Answer(0, i))
        return out


@pytest.fixture
def conn(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(client, "BACKOFF", 0.0)
    c = client.Connection.__new__(client.Connection)  # (no cluster: `_rounds` uses only the URL)
    c.url_safe = "aerospike://127.0.0.1:3000/test"
    return c


def test_only_the_busy_records_go_again_inline_and_land_in_their_places(conn: Any) -> None:
    server = Server({3: 1, 7: 2})
    got = conn._rounds("calling", server.send, 10, {"max_retries": 0}, False)
    assert [(a.result, a.index) for a in got] == [(0, i) for i in range(10)]
    assert server.rounds == [(list(range(10)), None), ([3, 7], True), ([7], True)]


def test_a_create_batch_is_spread_without_looking_for_repeats(conn: Any) -> None:
    server = Server({})
    conn._rounds("writing", server.send, 3, {"max_retries": 0}, True)
    assert server.rounds == [([0, 1, 2], False)]


def test_batches_go_in_parts_of_at_most_BATCH_records_each_retried_on_its_own(conn: Any) -> None:
    n = client.BATCH
    server = Server({1: 1, n + 1: 1})
    got = conn._rounds("calling", server.send, n + 3, {"max_retries": 0}, False)
    assert [a.index for a in got] == list(range(n + 3))
    assert server.rounds == [(list(range(n)), None), ([1], True), ([n, n + 1, n + 2], None), ([n + 1], True)]


def test_a_record_that_stays_busy_is_a_storage_error_naming_the_store(conn: Any) -> None:
    server = Server({2: client.RETRIES})
    with pytest.raises(
        StorageError, match=r"calling on aerospike://127\.0\.0\.1:3000/test: 1 records stayed"
    ):
        conn._rounds("calling", server.send, 4, {"max_retries": 0}, False)
    assert len(server.rounds) == client.RETRIES


def test_a_batch_answered_short_is_a_storage_error_not_a_missing_answer(conn: Any) -> None:
    """The client's batch_apply answers no record at all when it reached no node."""

    def send(todo: list[int], policy: dict[str, Any], inline: bool | None) -> list[Answer]:
        return []

    with pytest.raises(StorageError, match=r"calling the store's rules on .*: 0 of 5 answered"):
        conn._rounds("calling the store's rules", send, 5, {"max_retries": 0}, False)
