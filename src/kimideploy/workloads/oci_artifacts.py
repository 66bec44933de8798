"""Drafters and datasets as OCI artifacts, pushed and pulled with the ORAS CLI.

ORAS (oras.land, the CNCF client for OCI artifacts) rather than a hand-written registry client or
the oras Python SDK: it speaks the distribution protocol with the registry's own auth flows, reads
Docker's credential file (the mounted dockerconfigjson Secret), and checks every blob it pulls
against the digest its manifest names (the Python SDK 0.2 does not verify downloads). kimideploy
adds what ORAS cannot know: which files a drafter is (the files vLLM loads and the lineage), each
file's sha256 checked again after a pull against what was published, and errors named so that a
serve pod fails in seconds, before the 25-minute load, saying whether the digest is wrong, the
artifact missing, the credentials refused or the registry unreachable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.config.specs import RegistryAccess
from kimideploy.workloads.runtime import BadInputError, log

ARTIFACT_TYPES = {
    "drafter": "application/vnd.kimideploy.drafter.v1",
    "conversations": "application/vnd.kimideploy.conversations.v1",
}
FILE_MEDIA_TYPE = "application/vnd.kimideploy.file.v1"
ORAS_ENV = "KIMIDEPLOY_ORAS"
"""The ORAS binary (default: `oras` on PATH, as the images install it)."""
PULLED_MARKER = ".kimideploy-pulled.json"
PUSH_ATTEMPTS = 3


class RegistryError(Exception):
    """What the registry or ORAS said, classified; `exit_code` is the workload's."""

    def __init__(self, message: str, hint: str, exit_code: int) -> None:
        super().__init__(message)
        self.hint, self.exit_code = hint, exit_code


def oras_binary() -> str:
    return os.environ.get(ORAS_ENV) or shutil.which("oras") or "oras"


def _access_args(access: RegistryAccess) -> list[str]:
    args = ["--registry-config", access.config]
    if access.ca_file:
        args += ["--ca-file", access.ca_file]
    if access.plain_http:
        args.append("--plain-http")
    return args


_URL = re.compile(r"\"?https?://[^\s\"]+\"?")
# (words in ORAS's error line, what it means, what to do, exit code), first match wins; the
# order matters: a TLS failure says "failed to verify certificate", not a damaged blob.
RULES: tuple[tuple[tuple[str, ...], str, str, int], ...] = (
    (
        ("unauthorized", "status code 401", "status code 403", "denied", "forbidden", "credential"),
        "the registry refused the credentials for {ref}",
        "check the registry Secret (registry.push_secret / pull_secret): its dockerconfigjson "
        "must hold a current token with the right rights",
        2,
    ),
    (
        ("not found", "status code 404", "manifest unknown", "name unknown", "blob unknown"),
        "{ref} is not in the registry: a wrong digest, or never published",
        "compare the digest in kimideploy.yaml with `kimideploy drafter publish`'s output",
        2,
    ),
    (
        ("x509:", "tls:", "certificate"),
        "the registry's TLS certificate for {ref} is not trusted",
        "put the CA that signed it in a Secret with key ca.crt and name it in registry.ca_secret "
        "(or fix the registry's certificate)",
        2,
    ),
    (
        (
            "mismatch",
            "does not match",
            "failed to verify",
            "verification failed",
            "unexpected digest",
            "invalid digest",
        ),
        "a blob of {ref} does not match its digest: the stored artifact is damaged or was altered",
        "publish it again; nothing unverified was kept",
        2,
    ),
)


def classify(stderr: str, reference: str) -> RegistryError:
    """ORAS's error text, as what the user must do about it. The words are matched on ORAS's
    error line with URLs taken out: an upload URL carries base64 state that can spell anything.
    Anything else is the network (exit 1: the one failure a push tries again)."""
    said = _last_error_line(stderr)
    text = _URL.sub("URL", said).lower()
    for words, meaning, hint, code in RULES:
        if any(word in text for word in words):
            return RegistryError(f"{meaning.format(ref=reference)} (oras: {said})", hint, code)
    return RegistryError(
        f"cannot reach the registry for {reference} (oras: {said})",
        "is the registry up and reachable from this pod (DNS, network policy, TLS CA)?",
        1,
    )


def _last_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return (errors or lines or ["no output"])[-1][:300]


def _oras(args: list[str], cwd: Path | None = None, timeout: float = 3600) -> str:
    try:
        done = subprocess.run(
            [oras_binary(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError as exc:
        raise RegistryError(
            f"the ORAS CLI is not installed ({oras_binary()})",
            "use an image built by kimideploy (every image carries oras)",
            2,
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise RegistryError(
            f"oras {args[0]} did not finish in {timeout:.0f} s", "retry", 1
        ) from exc
    if done.returncode != 0:
        reference = next((a for a in args if "/" in a and ("@" in a or ":" in a)), "the artifact")
        raise classify(done.stderr or done.stdout, reference)
    return done.stdout


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def artifact_files(folder: Path) -> list[str]:
    """The regular files of a drafter or dataset folder, relative, in a stable order. A link is
    refused (a published artifact holds what is in the folder, nothing it points at)."""
    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts):
            continue  # temporaries, locks, kimideploy's own markers
        if path.is_symlink():
            raise BadInputError(f"{path} is a symbolic link; a published artifact holds files only")
        if path.is_file():
            found.append(str(relative))
    if not found:
        raise BadInputError(f"{folder} holds no files to publish")
    return found


@dataclass(frozen=True)
class Pushed:
    reference: str
    digest: str
    files: dict[str, str]
    size: int


def push(
    folder: Path,
    kind: str,
    repository: str,
    tag: str,
    *,
    annotations: dict[str, str],
    access: RegistryAccess,
) -> Pushed:
    """Every file of `folder` as one artifact, tagged `tag`; returns its digest and the files'
    sha256. A push that fails on the network is tried again (blobs already there are skipped)."""
    files = artifact_files(folder)
    checksums = {name: file_sha256(folder / name) for name in files}
    # In the pod's /tmp (an emptyDir): the volume it publishes from is mounted read-only.
    handle, name = tempfile.mkstemp(prefix="kimideploy-annotations-", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump({"$manifest": annotations}, out)
    notes = Path(name)
    args = [
        "push",
        *_access_args(access),
        "--artifact-type",
        ARTIFACT_TYPES[kind],
        "--annotation-file",
        str(notes),
        "--format",
        "json",
        f"{repository}:{tag}",
        *(f"{name}:{FILE_MEDIA_TYPE}" for name in files),
    ]
    try:
        for attempt in range(1, PUSH_ATTEMPTS + 1):
            try:
                output = _oras(args, cwd=folder)
                break
            except RegistryError as exc:
                if exc.exit_code != 1 or attempt == PUSH_ATTEMPTS:
                    raise
                log(f"push attempt {attempt} failed ({exc}); trying again")
                time.sleep(2 * attempt)
    finally:
        notes.unlink(missing_ok=True)
    result = json.loads(output)
    digest = str(result["digest"])
    size = sum((folder / name).stat().st_size for name in files)
    return Pushed(f"{repository}@{digest}", digest, checksums, size)


FolderCheck = Callable[[Path], None]


def pull(
    reference: str,
    dest: Path,
    files: dict[str, str],
    access: RegistryAccess,
    check: FolderCheck | None = None,
) -> bool:
    """The artifact into `dest` (False: it was there already, and every file still is what
    was pinned). ORAS verifies every blob against the manifest; each file is then checked against
    the published sha256 (and by `check`, which raises) and only then renamed into place, so
    `dest` is either complete and verified or absent. A folder already there is trusted by its
    content, never by its marker: it is hashed against the pins at every start (seconds, against
    a 25-minute load) and pulled again into a fresh folder on any difference."""
    why = _present_and_intact(dest, reference, files)
    if why is None:
        if check is not None:
            check(dest)
        return False
    if (dest / PULLED_MARKER).exists() or dest.is_symlink():
        log(f"{dest}: pulling again: {why}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".{dest.name}.pull-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        _oras(["pull", *_access_args(access), "--output", str(partial), reference])
        _verify(partial, files, reference)
        if check is not None:
            check(partial)
        (partial / PULLED_MARKER).write_text(json.dumps({"reference": reference, "files": files}))
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.exists():
            shutil.rmtree(dest)
        partial.rename(dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return True


def _present_and_intact(dest: Path, reference: str, files: dict[str, str]) -> str | None:
    """None when `dest` holds exactly the pinned files of `reference`, else why it does not."""
    if dest.is_symlink() or not dest.is_dir():
        return "not there" if not dest.is_symlink() else "it is a symbolic link"
    marker = dest / PULLED_MARKER
    try:
        recorded = json.loads(marker.read_text()) if marker.is_file() else None
    except (OSError, ValueError):
        return "its marker cannot be read (a marker that does not parse means not pulled)"
    if not isinstance(recorded, dict) or recorded.get("reference") != reference:
        return "it was pulled from another reference, or never completed"
    if not files:
        return "kimideploy.yaml pins no sha256 for its files, so what is there cannot be checked"
    try:
        got = _every_file_sha256(dest)
    except BadInputError as exc:
        return str(exc)
    wrong = sorted(n for n in set(files) | set(got) if files.get(n) != got.get(n))
    if wrong:
        return f"files {', '.join(wrong[:5])} differ from the sha256 pinned in kimideploy.yaml"
    return None


def _every_file_sha256(folder: Path) -> dict[str, str]:
    """Every file in the folder but kimideploy's marker, dot-names included: a file the pin does
    not list is a difference (a planted `.py` beside a config.json with an auto_map would run in
    a trust_remote_code pod). A link or anything not a regular file is refused."""
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        relative = str(path.relative_to(folder))
        if relative == PULLED_MARKER:
            continue
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise BadInputError(f"{relative} is a link or a special file")
        if path.is_file():
            found[relative] = file_sha256(path)
    return found


def _verify(folder: Path, files: dict[str, str], reference: str) -> None:
    if not files:
        artifact_files(folder)  # links refused
        return  # a record without checksums (written by hand): ORAS's blob digests stand
    try:
        got = _every_file_sha256(folder)
    except BadInputError as exc:
        raise RegistryError(f"{reference}: {exc}", "publish the drafter again", 2) from exc
    wrong = sorted(n for n in set(files) | set(got) if files.get(n) != got.get(n))
    if wrong:
        raise RegistryError(
            f"{reference}: files {', '.join(wrong[:5])} differ from what was published "
            "(sha256 in kimideploy.yaml)",
            "publish the drafter again, or correct source.oci.files in kimideploy.yaml",
            2,
        )


def describe(result: Pushed) -> dict[str, Any]:
    return {
        "reference": result.reference,
        "digest": result.digest,
        "files": result.files,
        "bytes": result.size,
    }
