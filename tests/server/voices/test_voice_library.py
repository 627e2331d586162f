"""Which voice a request names (server/voices/library.py): an unknown one is a small error naming a few close
matches, found without reading every created voice, over HTTP and Realtime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
from websockets.sync.client import connect

from server.state import state_of
from tests.server.conftest import LiveServer
from tests.server.realtime_client import recv, send

TEXT = "hello world this is a tiny test"
DESIGN = "A calm, deep male voice, speaking slowly."


def test_an_unknown_voice_is_a_small_error_and_a_cheap_lookup(make_server: Callable[..., LiveServer],
                                                              tmp_path: Path) -> None:
    server = make_server(data_dir=tmp_path)
    store = state_of(server.app).library
    for i in range(1000):  # through the store: a thousand creations over HTTP would take long
        store.add_voice(f"Voice number {i}", server.engine.model_id, prompt=DESIGN)
    statements: list[str] = []
    assert store._db is not None
    store._db.set_trace_callback(statements.append)
    try:
        miss = httpx.post(server.url + "/v1/audio/speech", json={"model": "tts-1", "input": TEXT,
                                                                 "voice": "Voice numbr 7"}, timeout=30)
        miss_sql = list(statements)  # with parameters in place
        store.voice_named(server.engine.model_id, "voice number 7")
    finally:
        store._db.set_trace_callback(None)
    error = miss.json()["error"]
    assert miss.status_code == 400 and len(error["message"]) < 400, error
    assert "did you mean" in error["message"] and error["message"].count("Voice number") <= 3
    assert miss_sql and not [s for s in miss_sql if "FROM voices" in s and "LIMIT" not in s]  # no reading them all
    lookup = statements[len(miss_sql):]
    assert len(lookup) == 1
    plan = " ".join(str(r) for r in store._db.execute("EXPLAIN QUERY PLAN " + lookup[0]))
    assert "voices_by_key" in plan and "SCAN" not in plan  # one row, through the key's index
    with connect(server.ws_url, max_size=None) as conn:
        assert recv(conn)["type"] == "session.created"
        send(conn, "session.update", session={"voice": "Voice numbr 7"})
        event = next(e for e in iter(lambda: recv(conn), None) if e["type"] == "error")
        assert len(event["error"]["message"]) < 400 and "did you mean" in event["error"]["message"]
