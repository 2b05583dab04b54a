"""A loopback stand-in of the Hugging Face Hub's HTTP API, for the endpoints that
``huggingface_hub.snapshot_download(repo_type="dataset")`` calls (read from the installed
library, huggingface_hub 2.x):

- ``GET /api/datasets/{repo}/revision/{rev}``        repo info: ``sha`` = the resolved commit
- ``GET /api/datasets/{repo}/tree/{rev}?recursive=``  the file list (``type``, ``path``, ``size``, ``oid``)
- ``HEAD|GET /datasets/{repo}/resolve/{rev}/{path}``  file metadata (``X-Repo-Commit``, ``ETag``,
  ``Content-Length``) and content

Errors carry the Hub's ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``), which the library turns into its own exception types.
Serves 127.0.0.1 only, from a thread; ``close()`` stops it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class HubStandIn:
    def __init__(self):
        self.repos: dict[
            str, dict
        ] = {}  # repo id -> {"refs": {name: commit}, "commits": {commit: {path: bytes}}, "gated": bool}
        self.requests: list[tuple[str, str]] = []  # (method, path) in arrival order
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # ---- repository state ----
    def push(self, repo_id: str, files: dict[str, bytes], branch: str = "main", gated: bool = False) -> str:
        """A new commit on ``branch`` with exactly ``files``; returns its 40-hex id."""
        with self._lock:
            repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}, "gated": gated})
            repo["gated"] = gated
            commit = hashlib.sha1(f"{repo_id}/{len(repo['commits'])}/{sorted(files)}".encode()).hexdigest()
            repo["commits"][commit] = dict(files)
            repo["refs"][branch] = commit
            return commit

    def _resolve(self, repo_id: str, revision: str):
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, None, ("RepoNotFound", 404)
        if repo["gated"]:
            return None, None, ("GatedRepo", 403)
        commit = repo["refs"].get(revision, revision if revision in repo["commits"] else None)
        if commit is None:
            return repo, None, ("RevisionNotFound", 404)
        return repo, commit, None

    def _handler_class(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _error(self, code: str, status: int, head: bool = False):
                body = json.dumps({"error": f"{code} (stand-in)"}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", f"{code} (stand-in)")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, value):
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _route(self, head: bool):
                path = unquote(urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                    repo_id, kind, revision = "/".join(parts[2:4]), parts[4], parts[5]
                    repo, commit, error = hub._resolve(repo_id, revision)
                    if error:
                        return self._error(*error, head=head)
                    files = repo["commits"][commit]
                    if kind == "revision":
                        return self._json(
                            {
                                "id": repo_id,
                                "sha": commit,
                                "private": False,
                                "gated": False,
                                "siblings": [{"rfilename": p} for p in sorted(files)],
                            }
                        )
                    return self._json(
                        [
                            {"type": "file", "path": p, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for p, data in sorted(files.items())
                        ]
                    )
                if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
                    repo_id, revision, file_path = "/".join(parts[1:3]), parts[4], "/".join(parts[5:])
                    repo, commit, error = hub._resolve(repo_id, revision)
                    if error:
                        return self._error(*error, head=head)
                    data = repo["commits"][commit].get(file_path)
                    if data is None:
                        return self._error("EntryNotFound", 404, head=head)
                    self.send_response(200)
                    self.send_header("X-Repo-Commit", commit)
                    self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Content-Type", "application/octet-stream")
                    self.end_headers()
                    if not head:
                        self.wfile.write(data)
                    return None
                return self._error("RepoNotFound", 404, head=head)

            def do_GET(self):
                self._route(head=False)

            def do_HEAD(self):
                self._route(head=True)

        return Handler
