"""Who may talk to the server (server/guard.py), on live servers: the key before any body is read, a foreign
`Origin` refused on what changes state and on the WebSocket, and a `Host` that is not the server's own refused
(DNS rebinding). Plain clients with no `Origin` and the server's own page keep working."""

from __future__ import annotations

import io
import socket
import wave
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from server.guard import SitePolicy, authority, same_site
from server.limits import UPLOAD_BODY_BYTES
from tests.server.conftest import API_KEY, LiveServer
from tests.server.rawclient import recv_exact

SPEECH = {"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "pcm"}
EVIL = "https://evil.example"


def wav_bytes(seconds: float = 0.5) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(b"\x00\x01" * int(24000 * seconds))
    return out.getvalue()


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def head_of(sock: socket.socket) -> bytes:
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += recv_exact(sock, 1)
    return head


# -- the key before the body ---------------------------------------------------------------------------------
def test_an_upload_without_the_key_gets_401_before_its_body_is_sent(make_server: Callable[..., LiveServer]) -> None:
    """An 11 MiB upload (within the body limit, so nothing else refuses it early): the 401 comes back after the
    head and a first piece of the body, while the rest is never sent."""
    server = make_server(api_key=API_KEY)
    host, port = server.url.removeprefix("http://").split(":")
    for auth in (b"", b"Authorization: Bearer wrong\r\n"):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/audio/voice_consents HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %d\r\n"
                         b"Content-Type: multipart/form-data; boundary=b\r\n\r\n" % (auth, UPLOAD_BODY_BYTES))
            sock.sendall(b"--b\r\n" + b"\0" * 65536)
            head = head_of(sock)  # without the fix the server waits here for the other 11 MiB
            assert head.startswith(b"HTTP/1.1 401"), head


def test_anything_without_the_key_is_401_whatever_its_body(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(api_key=API_KEY)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            invalid = c.post("/v1/audio/speech", content=b"{not json", headers={**headers,
                                                                               "Content-Type": "application/json"})
            assert error_of(invalid, 401)["type"] == "authentication_error"
            form = c.post("/v1/audio/voices", data={"name": "x"}, files={"audio_sample": ("a.wav", wav_bytes())},
                          headers=headers)
            error_of(form, 401)
            error_of(c.delete("/v1/audio/voices/voice_x", headers=headers), 401)
            error_of(c.get("/v1/realtime", headers=headers), 401)
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200  # open as before
        assert c.get("/metrics").status_code == 200 and c.get("/docs").status_code == 200
        keyed = c.post("/v1/audio/speech", json=SPEECH, headers={"Authorization": f"Bearer {API_KEY}"})
        assert keyed.status_code == 200 and keyed.content


# -- Origin ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("origin", [EVIL, "null", "http://127.0.0.1:1", "http://localhost"])
def test_a_foreign_origin_may_not_change_state_and_the_servers_own_may(live: LiveServer, origin: str) -> None:
    """Another site's page (or a sandboxed one: `null`, or another port of this machine) creates nothing, speaks
    nothing, deletes nothing and opens no WebSocket."""
    headers = {"Origin": origin}
    with httpx.Client(base_url=live.url, timeout=30, headers=headers) as c:
        consent = c.post("/v1/audio/voice_consents", data={"name": "x", "language": "en-US"},
                         files={"recording": ("a.wav", wav_bytes())})
        assert error_of(consent, 403)["code"] == "origin_not_allowed"
        error_of(c.post("/v1/audio/speech", json=SPEECH), 403)
        error_of(c.delete("/v1/audio/voices/voice_x"), 403)
        assert c.get("/v1/models").status_code == 200  # reading is CORS's business: the page cannot see it
    with pytest.raises(InvalidStatus) as denied:
        connect(live.ws_url, origin=origin, open_timeout=30)  # type: ignore[arg-type]
    assert denied.value.response.status_code == 403
    served_beside_it(live)


def served_beside_it(live: LiveServer) -> None:
    """What is not another site is served: no Origin (curl, the SDK), and the server's own page by either name."""
    port = live.url.rsplit(":", 1)[1]
    for origin in (None, live.url, f"http://localhost:{port}"):
        headers = {"Origin": origin, "Host": origin.removeprefix("http://")} if origin else {}
        resp = httpx.post(live.url + "/v1/audio/speech", json=SPEECH, headers=headers, timeout=60)
        assert resp.status_code == 200 and resp.content, (origin, resp.text)
    with connect(live.ws_url, origin=live.url, open_timeout=30) as conn:  # type: ignore[arg-type]
        assert '"session.created"' in str(conn.recv(timeout=30))


def test_a_foreign_origin_is_refused_with_the_key_too(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(api_key=API_KEY)
    headers = {"Origin": EVIL, "Authorization": f"Bearer {API_KEY}"}
    error_of(httpx.post(server.url + "/v1/audio/speech", json=SPEECH, headers=headers, timeout=30), 403)


# -- Host ------------------------------------------------------------------------------------------------------
def test_a_foreign_host_is_refused_and_loopback_names_are_served(live: LiveServer) -> None:
    """DNS rebinding: a page on evil.example, its name pointed at 127.0.0.1, is same-origin with itself."""
    port = live.url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example",
                 "[::1", "a b"):
        for method, path in (("GET", "/health"), ("GET", "/"), ("POST", "/v1/audio/speech")):
            headers = {"Host": host, "Origin": f"http://{host}"}
            resp = httpx.request(method, live.url + path, json=SPEECH, headers=headers, timeout=30)
            assert error_of(resp, 400)["code"] == "host_not_allowed", (host, path)
    with pytest.raises(InvalidStatus) as denied:
        connect(live.ws_url, additional_headers={"Host": "evil.example"}, open_timeout=30)
    assert denied.value.response.status_code == 400
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]", f"[::1]:{port}", "LOCALHOST.", "127.0.0.2",
                 f"[::ffff:127.0.0.1]:{port}"):
        assert httpx.get(live.url + "/health", headers={"Host": host}, timeout=30).status_code == 200, host


def test_settings_allow_more_hosts_and_origins(make_server: Callable[..., LiveServer]) -> None:
    site = SitePolicy("127.0.0.1", hosts=("tts.example", "other.example:8443"), origins=("https://app.example",))
    server = make_server(site=site)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for host, status in (("tts.example", 200), ("tts.example:80", 200), ("other.example:8443", 200),
                             ("other.example", 400), ("evil.example", 400), ("localhost", 200)):
            assert c.get("/health", headers={"Host": host}).status_code == status, host
        assert c.post("/v1/audio/speech", json=SPEECH, headers={"Origin": "https://app.example"}).status_code == 200
        page = {"Host": "tts.example", "Origin": "https://tts.example"}  # its own page, behind a TLS proxy
        assert c.post("/v1/audio/speech", json=SPEECH, headers=page).status_code == 200
        error_of(c.post("/v1/audio/speech", json=SPEECH, headers={"Origin": EVIL}), 403)
    anything = make_server(site=SitePolicy("127.0.0.1", hosts=("*",), origins=("*",)))
    headers = {"Host": "evil.example", "Origin": EVIL}
    assert httpx.post(anything.url + "/v1/audio/speech", json=SPEECH, headers=headers, timeout=60).status_code == 200


def test_a_server_on_every_address_takes_any_host_unless_given_a_list(make_server: Callable[..., LiveServer]) -> None:
    """Bound to 0.0.0.0 the names it is reached by are unknown: any Host, unless --allowed-hosts lists them. A
    foreign origin is still refused."""
    open_server = make_server(site=SitePolicy("0.0.0.0"))
    assert httpx.get(open_server.url + "/health", headers={"Host": "box.lan"}, timeout=30).status_code == 200
    error_of(httpx.post(open_server.url + "/v1/audio/speech", json=SPEECH, headers={"Origin": EVIL}, timeout=30), 403)
    listed = make_server(site=SitePolicy("::", hosts=("box.lan",)))
    assert httpx.get(listed.url + "/health", headers={"Host": "box.lan"}, timeout=30).status_code == 200
    error_of(httpx.get(listed.url + "/health", headers={"Host": "evil.example"}, timeout=30), 400)
    specific = make_server(site=SitePolicy("192.0.2.7"))  # as if bound there: that address, and loopback names
    for host, status in (("192.0.2.7:8000", 200), ("127.0.0.1", 200), ("192.0.2.8", 400)):
        assert httpx.get(specific.url + "/health", headers={"Host": host}, timeout=30).status_code == status, host


# -- the parts -------------------------------------------------------------------------------------------------
def test_authorities_and_origins_parse_strictly() -> None:
    assert authority("LocalHost.:8000") == ("localhost", 8000)
    assert authority("[::1]:9") == ("::1", 9) and authority("[::1]") == ("::1", None)
    for bad in ("::1", "[::1", "[::1]x", "host:port", "host:123456", "host:99999", "", ":80", "localhost..", "."):
        assert authority(bad) is None, bad
    assert same_site("https://tts.example", ("tts.example", None))
    assert same_site("http://tts.example:80", ("tts.example", None))
    assert not same_site("https://tts.example", ("tts.example", 80))
    assert not same_site("null", ("tts.example", None)) and not same_site("ftp://tts.example", ("tts.example", None))


def test_settings_come_from_flags_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from server import cli

    monkeypatch.setenv("TALKSTREAM_ALLOWED_HOSTS", "env.example")
    monkeypatch.setenv("TALKSTREAM_ALLOWED_ORIGINS", "https://env.example")
    from_env = cli.site_policy(cli.parser().parse_args(["serve", "--host", "0.0.0.0"]))
    assert from_env == SitePolicy("0.0.0.0", ("env.example",), ("https://env.example",))
    flags = cli.parser().parse_args(["serve", "--allowed-hosts", "a.example, b.example",
                                     "--allowed-origins", "https://a.example"])
    assert cli.site_policy(flags) == SitePolicy("127.0.0.1", ("a.example", "b.example"), ("https://a.example",))


def raw_status(live: LiveServer, head: bytes) -> int:
    """The status of a request sent as bytes (headers an HTTP client would not send)."""
    with socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(head)
        return int(head_of(sock).split()[1])


def test_two_host_headers_or_none_in_http_1_1_are_refused(live: LiveServer) -> None:
    """Which of two Hosts a proxy and the server each read is anyone's guess: the foreign one first got a 200."""
    two = b"GET /health HTTP/1.1\r\nHost: evil.example\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    none = b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
    assert raw_status(live, two) == raw_status(live, none) == 400
    one = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    old = b"GET /health HTTP/1.0\r\n\r\n"  # HTTP/1.0 has no Host to require
    assert raw_status(live, one) == raw_status(live, old) == 200
