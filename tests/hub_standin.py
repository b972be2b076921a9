"""A stand-in Hugging Face hub on loopback, for the background download (issue 33).

huggingface_hub honours HF_ENDPOINT; this serves one repo's files from a local folder with the
routes and headers `HfApi.model_info(files_metadata=True)` and `hf_hub_download` need: the
model info JSON (`/api/models/{repo}[/revision/{rev}]`, siblings with sizes), and
`/{repo}/resolve/{rev}/{file}` for HEAD (X-Repo-Commit, ETag, Content-Length) and GET (with
Range, so a broken transfer resumes). Transfers are throttled so progress can be seen; the
largest file can be held at a byte offset until `release()`, or broken there, after which the
hub is down (every connection closed unanswered) until `restore()`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

SHA = "1234567890abcdef1234567890abcdef12345678"
CHUNK = 8192


class StandinHub:
    def __init__(self, repo_id: str, folder: Path, rate: float = 200_000.0) -> None:
        self.repo_id = repo_id
        self.files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        self.largest = max(self.files, key=lambda n: len(self.files[n]))
        self.rate = rate  # bytes per second per transfer
        self.hold_at: int | None = None  # the largest file waits here for release()
        self.break_at: int | None = None  # the largest file's transfer breaks here (once)
        self.gate = threading.Event()
        self.down = threading.Event()
        self.served: list[str] = []  # "METHOD path" of every answered request
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self) -> None:
                hub.answer(self, head=True)

            def do_GET(self) -> None:
                hub.answer(self, head=False)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def total_bytes(self) -> int:
        return sum(len(b) for b in self.files.values())

    def __enter__(self) -> StandinHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()

    def release(self) -> None:
        self.gate.set()

    def restore(self) -> None:
        self.down.clear()

    # -- routes ---------------------------------------------------------------------------
    def answer(self, handler: BaseHTTPRequestHandler, head: bool) -> None:
        if self.down.is_set():  # the network is gone: the connection closes unanswered
            handler.close_connection = True
            return
        path = unquote(urlparse(handler.path).path)
        self.served.append(f"{'HEAD' if head else 'GET'} {path}")
        info = f"/api/models/{self.repo_id}"
        resolve = f"/{self.repo_id}/resolve/"
        if path == info or path.startswith(info + "/revision/"):
            self.model_info(handler)
        elif path.startswith(info + "/tree/"):  # transformers lists extra chat templates
            self.send(handler, 200, b"[]", {"Content-Type": "application/json"})
        elif path.startswith(resolve):
            name = path[len(resolve) :].split("/", 1)[-1]
            self.file(handler, name, head)
        else:
            self.send(
                handler, 404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"}
            )

    def model_info(self, handler: BaseHTTPRequestHandler) -> None:
        siblings = [{"rfilename": n, "size": len(b)} for n, b in self.files.items()]
        body = {"id": self.repo_id, "modelId": self.repo_id, "sha": SHA, "private": False,
                "siblings": siblings}  # fmt: skip
        self.send(handler, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def file(self, handler: BaseHTTPRequestHandler, name: str, head: bool) -> None:
        data = self.files.get(name)
        if data is None:
            self.send(handler, 404, b"", {"X-Error-Code": "EntryNotFound"})
            return
        etag = hashlib.sha256(data).hexdigest()
        headers = {"X-Repo-Commit": SHA, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        start = 0
        ranged = handler.headers.get("Range", "")
        if ranged.startswith("bytes="):
            start = int(ranged[6:].split("-")[0] or 0)
        if head:
            self.send(handler, 200, b"", {**headers, "Content-Length": str(len(data))}, body=False)
            return
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        handler.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data) - start)}.items():
            handler.send_header(key, value)
        handler.end_headers()
        self.stream(handler, name, data, start)

    def stream(self, handler: BaseHTTPRequestHandler, name: str, data: bytes, pos: int) -> None:
        while pos < len(data):
            end = min(len(data), pos + CHUNK)
            if name == self.largest:
                for mark in (self.hold_at, self.break_at):
                    if mark is not None and pos < mark < end:
                        end = mark
                if self.break_at is not None and pos >= self.break_at:
                    self.break_at = None
                    self.down.set()
                    handler.close_connection = True
                    return
                if self.hold_at is not None and pos >= self.hold_at and not self.gate.is_set():
                    self.gate.wait(300)
            handler.wfile.write(data[pos:end])
            handler.wfile.flush()
            time.sleep((end - pos) / self.rate)
            pos = end

    @staticmethod
    def send(
        handler: BaseHTTPRequestHandler,
        status: int,
        data: bytes,
        headers: dict[str, str],
        body: bool = True,
    ) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        if "Content-Length" not in headers:
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
