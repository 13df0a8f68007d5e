"""`speedgpt chat RUN --serve`: a small local web page to chat with a model, on Python's http.server.

GET / is the page; POST /chat takes {"messages": [...]} (the whole conversation, ending with the user)
and streams the answer as it is generated (HTTP/1.1 chunked), one JSON object a line: {"text": "..."}
pieces, then {"cut": "why"} when the answer stopped before its end (--max-tokens, a full context), so
the page can say so without the note entering the conversation. The server keeps no conversation:
the page holds it, so "New conversation" just empties the page. One answer is generated at a time (a
lock: the model and its cache are not shared between threads). Bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import urlsplit

from .session import cut_reason
from .template import ConversationError

MAX_BODY = 1 << 20


def make_server(session_factory, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """The server (not yet serving): `session_factory()` gives a ChatSession for each answer."""
    lock = threading.Lock()
    page = (resources.files("speedgpt.chat") / "page.html").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: the terminal shows the URL, not every request
            pass

        def _plain(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            if code >= 400:  # a refused request's body may be unread (too large, another path): on a kept-alive
                # connection it was parsed as the next request, whose stray answer the client took for its next one
                self.send_header("Connection", "close")
                self.close_connection = True
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _chunk(self, line: dict) -> None:
            data = (json.dumps(line) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_GET(self):
            if urlsplit(self.path).path in ("/", "/index.html"):  # the page may carry ?q=...
                self._plain(200, page, "text/html; charset=utf-8")
            else:
                self._plain(404, b"not found\n")

        def do_POST(self):
            if self.path != "/chat":
                self._plain(404, b"not found\n")
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
                if not 0 < n <= MAX_BODY:
                    raise ValueError(f"a request body of 1 byte to {MAX_BODY} bytes is needed")
                messages = json.loads(self.rfile.read(n))["messages"]
                with lock:
                    session = session_factory()
                    session.load(messages)
            except (ValueError, KeyError, TypeError, ConversationError) as e:
                self._plain(400, f"bad request: {e}\n".encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            with lock:
                try:
                    for piece in session.answer():
                        self._chunk({"text": piece})
                    if session.cut:
                        self._chunk({"cut": cut_reason(session)})
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):  # the page went away: stop generating
                    pass

    return ThreadingHTTPServer((host, port), Handler)
