"""`kimideploy data put FILE --cluster C`: a file from this machine onto the cluster's datasets
volume (datagen's prompt file, a bench prompt set), as the pods will read it.

No command reached that volume before: a newcomer had to mount the claim by hand. The file
travels in ConfigMaps (each under the API server's object limit, the whole capped), a one-pod Job
mounts them with the datasets claim as datagen mounts it, joins them under a temporary name,
checks the sha256 kimideploy computed here, and renames it into place. A file already there
with the same content is left as it is; one with other content is never replaced unless asked
(`--replace`). The ConfigMaps and the Job are deleted afterwards.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from kimideploy.errors import UsageError
from kimideploy.plan import pods
from kimideploy.plan.inputs import DATASETS_MOUNT, PlanInputs
from kimideploy.plan.model import ObjectPlan

CHUNK_BYTES = 700 * 1024
"""Bytes per ConfigMap: a ConfigMap holds at most 1 MiB, and binaryData is stored base64."""
MAX_BYTES = 48 * 1024 * 1024
"""The most one upload carries (70 ConfigMaps); a larger file goes by the storage's own means."""
UPLOAD_MOUNT = "/upload"
CONTAINER = "probe"
"""The job-probe template's one container."""
CONFLICT_EXIT = 3
SCRIPT = (
    'dest="$1"; want="$2"; replace="$3"; parts="$4"; root="$5"; dir=$(dirname "$dest"); '
    'p="$dest"; while [ "$p" != "$root" ] && [ "$p" != / ]; do '
    'if [ -L "$p" ]; then echo "link $p"; exit 1; fi; p=$(dirname "$p"); done; '
    'if [ -e "$dest" ] && [ ! -f "$dest" ]; then echo "notfile $dest"; exit 1; fi; '
    'if [ -f "$dest" ]; then have=$(sha256sum < "$dest" | cut -d" " -f1); '
    'if [ "$have" = "$want" ]; then echo "present $dest $want"; exit 0; fi; '
    'if [ "$replace" != "replace" ]; then echo "conflict $dest $have"; exit 3; fi; fi; '
    'mkdir -p "$dir" && tmp=$(mktemp "$dir/.put.XXXXXXXXXX") || exit 1; '
    'cat "$parts"/* > "$tmp" || { rm -f "$tmp"; exit 1; }; '
    'got=$(sha256sum < "$tmp" | cut -d" " -f1); '
    'if [ "$got" != "$want" ]; then echo "corrupt $dest $got"; rm -f "$tmp"; exit 1; fi; '
    'mv -T -f "$tmp" "$dest" || { rm -f "$tmp"; exit 1; }; '
    'now=$(sha256sum < "$dest" | cut -d" " -f1); '
    'if [ "$now" != "$want" ]; then echo "raced $dest $now"; exit 1; fi; '
    'echo "wrote $dest $want"'
)
"""POSIX sh and coreutils (every image has them): refuse a link anywhere from the datasets mount
down to the file, join the parts (their names sort in order) into a temporary file of a unique
name (mktemp: created exclusively, never a planted link), verify, rename it over the destination
(`mv -T`: never into a folder planted at its name), and read back what the name now holds: two
overlapping `--replace` uploads each report the bytes that are there ("raced" for the one whose
bytes were replaced), never the other's under their own sha256. The last line says what
happened."""


@dataclass(frozen=True)
class Upload:
    destination: str
    """Absolute path in the pods (under the datasets mount)."""
    sha256: str
    size: int
    parts: tuple[dict[str, Any], ...]
    """The ConfigMaps carrying the bytes, in order."""
    job: ObjectPlan


def destination(relative: str) -> str:
    """A path on the datasets volume, as the config names it (relative, no `..`)."""
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts or not path.parts or relative.endswith("/"):
        raise UsageError(
            f"--as {relative}: a file path relative to the datasets volume, without '..'",
            hint="e.g. --as prompts/mixed-v1.jsonl (what workloads.datagen.prompts names)",
        )
    return f"{DATASETS_MOUNT}/{path}"


def upload(ctx: PlanInputs, relative: str, data: bytes, *, replace: bool) -> Upload:
    if len(data) > MAX_BYTES:
        raise UsageError(
            f"the file is {len(data):,} bytes; `data put` carries at most {MAX_BYTES:,}",
            hint="copy a larger file onto the datasets volume by your storage's own means",
        )
    dest = destination(relative)
    digest = hashlib.sha256(data).hexdigest()
    prefix = f"{ctx.release}-put-{digest[:10]}"
    labels = pods.standard_labels(ctx, component="dataset-put")
    labels.pop(f"{pods.LABEL_PREFIX}/run-id", None)
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    parts: tuple[dict[str, Any], ...] = tuple(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{prefix}-{i:03d}", "namespace": ctx.namespace, "labels": labels},
            "binaryData": {"part": base64.b64encode(chunk).decode()},
        }
        for i, chunk in enumerate(chunks)
    )
    sources = [
        {
            "configMap": {
                "name": p["metadata"]["name"],
                "items": [{"key": "part", "path": f"{i:05d}"}],
            }
        }
        for i, p in enumerate(parts)
    ]
    volumes, mounts = pods.claim_volumes(ctx, {"datasets": False})
    writable_volumes, writable_mounts = pods.writable_volumes()
    image = ctx.project.images[ctx.cluster.images.publish or ctx.cluster.images.vocab]
    job = pods.probe_job(
        ctx,
        component="dataset-put",
        fail_at_once={"containerName": CONTAINER, "operator": "In", "values": [1, CONFLICT_EXIT]},
        pod_annotations=ctx.cluster.workloads.datagen.pod_annotations,
        container={
            "node_selector": dict(sorted(ctx.cluster.node_selector.items())),
            "image": image.reference,
            "command": ["sh", "-c", SCRIPT, CONTAINER],
            "args": [dest, digest, "replace" if replace else "keep", UPLOAD_MOUNT, DATASETS_MOUNT],
            "env": [],
            "resources": pods.resources("100m", "128Mi", 0),
            "volumes": [
                *volumes,
                {"name": "upload", "projected": {"sources": sources}},
                *writable_volumes,
            ],
            "volume_mounts": [
                *mounts,
                {"name": "upload", "mountPath": UPLOAD_MOUNT, "readOnly": True},
                *writable_mounts,
            ],
        },
    )
    return Upload(dest, digest, len(data), parts, job)
