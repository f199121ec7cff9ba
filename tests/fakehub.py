"""A loopback model hub for the download tests: ModelScope's and the Hugging Face
hub's read routes, on one threaded HTTP server bound to 127.0.0.1.

It serves exactly what the pinned clients (modelscope 1.40.2 over modelscope-hub
0.5.1, huggingface_hub 2.4.0) call for `snapshot_download`, plus the front page
and the file list the suite's own first request reads (npu_conformance.weights):

  ModelScope   GET  /api/v1/models/<org>/<name>/repo/files?Revision=&Recursive=   file list (Path, Size, Sha256)
               GET  /api/v1/models/<org>/<name>/repo?Revision=&FilePath=          one file, HTTP Range honoured
               GET  /api/v1/models/<org>/<name>[/revisions]                        model info, branches and tags
               GET  /api/v1/repos/internalAccelerationInfo                        intra-cloud routing (none)
  HF hub       GET  /api/models/<org>/<name>/revision/<rev>[?blobs=true]           model info: commit sha, siblings
               GET  /api/models/<org>/<name>/tree/<rev>[/<path>]                   file tree (oid, size, lfs sha256)
               HEAD /<org>/<name>/resolve/<rev>/<file>                             ETag, X-Repo-Commit, X-Linked-*
               GET  /<org>/<name>/resolve/<rev>/<file>                             one file, HTTP Range honoured

Errors have each hub's shape: ModelScope a 404 with a JSON `Code`/`Message`/
`Success: false` body, the HF hub a 404 with `X-Error-Code` (RepoNotFound,
RevisionNotFound, EntryNotFound), which each client turns into its own error.
Fault switches: `drop_once` (the next full GET of a file is cut mid-body),
`corrupt` (a file is served with one byte flipped, so its sha256 is wrong).
`BlackHole` accepts TCP connections and never answers.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# Stored in LFS on the HF hub (its tree lists an lfs sha256 and the HEAD has X-Linked-*),
# as the hub's .gitattributes does for weights.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


def git_blob_id(data: bytes) -> str:
    """The git object id the HF hub reports for a file (its ETag when not in LFS)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    commit: str
    files: dict[str, bytes]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None


class FakeHub:
    """`with FakeHub() as hub: hub.add("org/name", folder, "master", "main")`, then
    point MODELSCOPE_ENDPOINT and HF_ENDPOINT at `hub.url`."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Snapshot]] = {}
        self.requests: list[Request] = []
        self.drop_once: set[str] = set()
        self.corrupt: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"hub": self}))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = "http://127.0.0.1:%d" % self._server.server_address[1]

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, repo: str, source: Path | dict[str, bytes], *revisions: str) -> Snapshot:
        """Serve `source` (a folder's top-level files, or name -> bytes) as `repo` at
        each of `revisions` (branch or tag names) and at its commit sha."""
        files = ({p.name: p.read_bytes() for p in sorted(source.iterdir()) if p.is_file()}
                 if isinstance(source, Path) else dict(source))
        commit = hashlib.sha1(json.dumps({n: hashlib.sha256(b).hexdigest() for n, b in sorted(files.items())})
                              .encode()).hexdigest()
        snapshot = Snapshot(commit, files)
        for name in (*revisions, commit):
            self.repos.setdefault(repo, {})[name] = snapshot
        return snapshot

    def downloads(self) -> list[Request]:
        """The file transfers asked of either hub's file route (GET with a body)."""
        return [r for r in self.requests if r.method == "GET" and ("/resolve/" in r.path or "FilePath=" in r.path)]

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _take_drop(self, name: str) -> bool:
        with self._lock:
            if name in self.drop_once:
                self.drop_once.discard(name)
                return True
            return False


class BlackHole:
    """A hub that accepts TCP connections and never sends a byte; `connections`
    counts what reached it."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self._socket.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def connections(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:  # closed by __exit__
                return
            self._held.append(conn)  # kept open, never read or answered

    def __enter__(self) -> BlackHole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close()
        for conn in self._held:
            conn.close()


class _HubError(Exception):
    def __init__(self, status: int, message: str, hf_code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.hf_code = status, message, hf_code


_REPO = r"(?P<repo>[^/]+/[^/]+)"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the hubs: the clients pool connections
    hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """Quiet: the hub's `requests` is the log."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch()

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.hub._record(Request(self.command, self.path, self.headers.get("Range")))
        hf = not url.path.startswith("/api/v1/")
        try:
            for pattern, route in self._routes():
                match = re.fullmatch(pattern, url.path)
                if match:
                    return route(**{k: unquote(v) for k, v in match.groupdict().items() if v is not None},
                                 query=query)
            raise _HubError(404, f"no route {url.path}", "EntryNotFound" if hf else None)
        except _HubError as exc:
            self._error(exc, hf)

    def _routes(self) -> Iterable[tuple[str, Callable[..., None]]]:
        return (
            ("/", self._front_page),
            ("/api/v1/repos/internalAccelerationInfo", self._ms_region),
            (rf"/api/v1/models/{_REPO}/repo/files", self._ms_files),
            (rf"/api/v1/models/{_REPO}/repo", self._ms_file),
            (rf"/api/v1/models/{_REPO}/revisions", self._ms_revisions),
            (rf"/api/v1/models/{_REPO}", self._ms_info),
            (rf"/api/models/{_REPO}/revision/(?P<rev>[^/]+)", self._hf_info),
            (rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", self._hf_tree),
            (rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<name>.+)", self._hf_file),
        )

    # ---- lookups, with each hub's error ----

    def _snapshot(self, repo: str, revision: str, hf: bool) -> Snapshot:
        revisions = self.hub.repos.get(repo)
        if revisions is None:
            raise _HubError(404, f"Repository {repo} not found", "RepoNotFound" if hf else None)
        if revision not in revisions:
            raise _HubError(404, f"Invalid rev id: {revision}" if hf else f"revision {revision} of {repo} not found",
                            "RevisionNotFound" if hf else None)
        return revisions[revision]

    def _file(self, snapshot: Snapshot, name: str, hf: bool) -> bytes:
        if name not in snapshot.files:
            raise _HubError(404, f"Entry not found: {name}", "EntryNotFound" if hf else None)
        data = snapshot.files[name]
        if name in self.hub.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    # ---- ModelScope ----

    def _ms_body(self, data: object) -> None:
        self._json({"Code": 200, "Data": data, "Message": "success", "RequestId": uuid.uuid4().hex,
                    "Success": True})

    def _ms_region(self, query: dict[str, str]) -> None:
        # Asked before the first file: no intra-cloud region, so the plain route.
        self._ms_body({"InternalRegionQueryAddress": ""})

    def _ms_files(self, repo: str, query: dict[str, str]) -> None:
        snapshot = self._snapshot(repo, query.get("Revision", "master"), hf=False)
        files = [{"Name": name, "Path": name, "Type": "blob", "Size": len(data), "Revision": snapshot.commit,
                  "Sha256": hashlib.sha256(data).hexdigest(), "IsLFS": name.endswith(LFS_SUFFIXES)}
                 for name, data in snapshot.files.items()]
        self._ms_body({"Files": files})

    def _ms_file(self, repo: str, query: dict[str, str]) -> None:
        snapshot = self._snapshot(repo, query.get("Revision", "master"), hf=False)
        name = query.get("FilePath", "")
        self._send_file(name, self._file(snapshot, name, hf=False), {})

    def _ms_revisions(self, repo: str, query: dict[str, str]) -> None:
        if repo not in self.hub.repos:
            raise _HubError(404, f"model {repo} not found")
        names = [n for n, s in self.hub.repos[repo].items() if n != s.commit]
        self._ms_body({"RevisionMap": {"Branches": [{"Revision": "master"}] if "master" in names else [],
                                       "Tags": [{"Revision": n} for n in names if n != "master"]}})

    def _ms_info(self, repo: str, query: dict[str, str]) -> None:
        if repo not in self.hub.repos:
            raise _HubError(404, f"model {repo} not found")
        org, name = repo.split("/")
        self._ms_body({"Path": org, "Name": name, "ModelId": repo, "Visibility": 5, "IsPublished": 1})

    # ---- Hugging Face hub ----

    def _hf_info(self, repo: str, rev: str, query: dict[str, str]) -> None:
        snapshot = self._snapshot(repo, rev, hf=True)
        blobs = query.get("blobs", "").lower() == "true"
        siblings = []
        for name, data in snapshot.files.items():
            entry: dict[str, object] = {"rfilename": name}
            if blobs:
                entry |= {"size": len(data), "blobId": git_blob_id(data)}
                if name.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                    "pointerSize": 134}
            siblings.append(entry)
        self._json({"_id": snapshot.commit[:24], "id": repo, "modelId": repo, "sha": snapshot.commit,
                    "private": False, "disabled": False, "gated": False, "downloads": 0, "likes": 0,
                    "tags": [], "siblings": siblings, "lastModified": "2026-01-01T00:00:00.000Z",
                    "createdAt": "2026-01-01T00:00:00.000Z"})

    def _hf_tree(self, repo: str, rev: str, query: dict[str, str], path: str = "") -> None:
        snapshot = self._snapshot(repo, rev, hf=True)
        if path:  # the files are top-level: no sub-folder exists
            raise _HubError(404, f"Entry not found: {path}", "EntryNotFound")
        entries = []
        for name, data in snapshot.files.items():
            entry: dict[str, object] = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": name}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        self._json(entries)

    def _hf_file(self, repo: str, rev: str, name: str, query: dict[str, str]) -> None:
        snapshot = self._snapshot(repo, rev, hf=True)
        data = snapshot.files.get(name)
        if data is None:
            raise _HubError(404, f"Entry not found: {name}", "EntryNotFound")
        headers = {"X-Repo-Commit": snapshot.commit, "ETag": f'"{git_blob_id(data)}"'}
        if name.endswith(LFS_SUFFIXES):
            headers |= {"X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Linked-Size": str(len(data))}
        self._send_file(name, self._file(snapshot, name, hf=True), headers)

    # ---- responses ----

    def _json(self, body: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _error(self, exc: _HubError, hf: bool) -> None:
        if hf:
            self._json({"error": exc.message}, exc.status,
                       {"X-Error-Code": exc.hf_code or "EntryNotFound", "X-Error-Message": exc.message})
        else:
            self._json({"Code": exc.status, "Message": exc.message, "RequestId": uuid.uuid4().hex,
                        "Success": False}, exc.status)

    def _front_page(self, query: dict[str, str]) -> None:
        payload = b"loopback hub\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _send_file(self, name: str, data: bytes, headers: dict[str, str]) -> None:
        start, end = 0, len(data) - 1
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if wanted:
            start = int(wanted[1])
            end = min(int(wanted[2]), end) if wanted[2] else end
            if start > end:
                self._json({"error": "range not satisfiable"}, 416, {"Content-Range": f"bytes */{len(data)}"})
                return
        self.send_response(206 if wanted else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if self.command == "HEAD":
            return
        body = data[start:end + 1]
        if not wanted and self.command == "GET" and self.hub._take_drop(name):
            # Half the body, then the connection goes: the client sees a short read.
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)
