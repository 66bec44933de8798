#!/usr/bin/env python3
"""Download one pinned Hugging Face revision to a local folder: resumable, verified, marked.

Runs ON the GPU host (uploaded by `kimideploy host sync-model`), so it uses the standard library
only. The token is read from the first line of stdin, never from the command line. Progress is
printed as JSON lines on stdout; human messages go to stderr.

Exit codes: 0 done, 2 refused (token, unknown revision), 3 verification failed (a file's hash, or
a listing that names a path outside the destination or a file without a hash: refused before
anything is written), 4 network error.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

MARKER = ".kimideploy-complete"
VERIFIED = ".kimideploy-verified.json"
CHUNK = 8 * 1024 * 1024


class SameHostAuthRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects (the hub sends large files to a CDN) but never leak the token elsewhere."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        old, moved = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        downgraded = old.scheme == "https" and moved.scheme != "https"
        if new is not None and (moved.netloc != old.netloc or downgraded):
            new.remove_header("Authorization")  # another host, or the token in clear text
        return new


OPENER = urllib.request.build_opener(SameHostAuthRedirect)


def request(url: str, token: str, headers: dict[str, str] | None = None) -> Any:
    all_headers = dict(headers or {})
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    return OPENER.open(urllib.request.Request(url, headers=all_headers), timeout=60)


def listing(endpoint: str, repo: str, revision: str, token: str) -> list[dict[str, Any]]:
    url = f"{endpoint}/api/models/{repo}/revision/{revision}?blobs=true"
    with request(url, token) as response:
        info = json.load(response)
    if info.get("sha") and info["sha"] != revision:
        raise SystemExit(f"the hub resolved {revision} to {info['sha']}: pin a full commit hash")
    files: list[dict[str, Any]] = info.get("siblings", [])
    return files


def expected_hash(entry: dict[str, Any]) -> tuple[str, str]:
    """('sha256', hex) for LFS files, ('git-sha1', hex) for small files kept in git."""
    lfs = entry.get("lfs") or {}
    if lfs.get("sha256"):
        return "sha256", lfs["sha256"]
    return "git-sha1", entry.get("blobId", "")


OWN_FILES = (MARKER, VERIFIED)


def listing_problems(dest: Path, files: list[dict[str, Any]]) -> list[str]:
    """Why this listing (from the hub, or a mirror set by HF_ENDPOINT) must not be followed: file
    names become paths under `dest`, so each must stay inside it, and each file must have a hash
    to be checked against."""
    root = dest.resolve()
    problems = []
    for entry in files:
        name = entry.get("rfilename")
        parts = PurePosixPath(name).parts if isinstance(name, str) else ()
        if (
            not isinstance(name, str) or not name or "\0" in name or "\\" in name
            or PurePosixPath(name).is_absolute() or ".." in parts or "." in parts
            or not (root / name).resolve().is_relative_to(root)
        ):  # fmt: skip
            problems.append(f"{name!r}: not a relative path inside {dest}")
            continue
        if name in OWN_FILES or name.endswith(".part"):
            problems.append(f"{name!r}: collides with the downloader's own files")
        if not expected_hash(entry)[1]:
            problems.append(f"{name!r}: the listing gives no hash (lfs.sha256 or blobId)")
    return problems


def file_hash(path: Path, kind: str, size: int) -> str:
    digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1()
    if kind == "git-sha1":
        digest.update(f"blob {size}\0".encode())
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def download(url: str, token: str, part: Path, size: int, progress: Any) -> None:
    """Append to the .part file from where it stopped (HTTP Range)."""
    if size == 0:  # nothing to fetch (a Range request for it would be unsatisfiable)
        part.touch()
        return
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    if have == size:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    with request(url, token, headers) as response, part.open("ab" if have else "wb") as out:
        if have and response.status != 206:  # server ignored the range: start over
            out.truncate(0)
        while chunk := response.read(CHUNK):
            out.write(chunk)
            progress(len(chunk))


def sync(args: argparse.Namespace, token: str) -> int:
    dest = Path(args.dest)
    files = listing(args.endpoint, args.repo, args.revision, token)
    problems = listing_problems(dest, files)
    if problems:
        for problem in problems:
            print(f"refused: {problem}", file=sys.stderr)
        print(f"the listing from {args.endpoint} was not followed; nothing was written",
              file=sys.stderr)  # fmt: skip
        return 3
    dest.mkdir(parents=True, exist_ok=True)
    verified_file = dest / VERIFIED
    verified: dict[str, str] = (
        json.loads(verified_file.read_text()) if verified_file.exists() else {}
    )
    total = sum(int((f.get("lfs") or {}).get("size") or f.get("size") or 0) for f in files)
    done, start = 0, time.monotonic()

    def progress(count: int) -> None:
        nonlocal done
        done += count
        rate = done / max(time.monotonic() - start, 1e-6)
        emit(
            {
                "event": "progress",
                "stage": "sync-model",
                "done": done,
                "total": total,
                "unit": "bytes",
                "rate": rate,
                "eta_s": (total - done) / rate if rate else None,
            }
        )

    for entry in files:
        name = entry["rfilename"]
        size = int((entry.get("lfs") or {}).get("size") or entry.get("size") or 0)
        kind, want = expected_hash(entry)
        target = dest / name
        if verified.get(name) == want and target.exists() and target.stat().st_size == size:
            progress(size)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        url = f"{args.endpoint}/{args.repo}/resolve/{args.revision}/{urllib.parse.quote(name)}"
        already = part.stat().st_size if part.exists() else 0
        progress(min(already, size))
        download(url, token, part, size, progress)
        if part.stat().st_size < size:  # the connection ended early: keep it and resume next time
            print(
                f"{name}: transfer stopped at {part.stat().st_size} of {size} bytes; run again "
                "to resume",
                file=sys.stderr,
            )
            return 4
        got = file_hash(part, kind, size)
        if part.stat().st_size != size or got != want:
            part.unlink()
            print(f"{name}: {kind} {got} != expected {want}; removed the download", file=sys.stderr)
            return 3
        part.replace(target)
        verified[name] = want
        verified_file.write_text(json.dumps(verified, indent=1, sort_keys=True))
    marker = {
        "repo": args.repo,
        "revision": args.revision,
        "files": len(files),
        "bytes": total,
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (dest / MARKER).write_text(json.dumps(marker, indent=1))
    emit({"event": "result", "stage": "sync-model", **marker})
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--endpoint", default=os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    )
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--dest", required=True)
    args = parser.parse_args()
    token = sys.stdin.readline().strip() if not sys.stdin.isatty() else ""
    try:
        return sync(args, token)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            print(
                f"the hub refused the token ({exc.code}): set HF_TOKEN to a token with access",
                file=sys.stderr,
            )
            return 2
        if exc.code == 404:
            print(f"{args.repo}@{args.revision} not found on {args.endpoint}", file=sys.stderr)
            return 2
        print(f"HTTP {exc.code} from {exc.url}", file=sys.stderr)
        return 4
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        print(f"network error: {exc}; run again to resume", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
