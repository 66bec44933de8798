"""The build context: only what the Dockerfile needs, as a byte-for-byte reproducible tar.

Entries are sorted, with mtime 0, uid/gid 0 and normalised modes, so the same inputs give the same
bytes, and the tag derived from their hash changes exactly when an input does.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from kimideploy.config.project import Project
from kimideploy.images.dockerfile import (
    constraints_path,
    get_image,
    patch_dir,
    patch_files,
    render_dockerfile,
)
from kimideploy.paths import package_dir, repository_root

SOURCE_SUFFIXES = (".py", ".sh", ".typed")


@dataclass(frozen=True)
class BuildContext:
    name: str
    tar: bytes
    files: tuple[str, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.tar).hexdigest()

    def tag(self, repository: str) -> str:
        return f"{repository}:{self.name}-{self.sha256[:12]}"


def context_files(project: Project, name: str) -> dict[str, bytes]:
    """Archive path -> content: the rendered Dockerfile, pins, this image's patches, the package."""
    image = get_image(project, name)
    root = repository_root()
    files = {"Dockerfile": render_dockerfile(project, name).encode()}
    pins = root / constraints_path(name)
    files[constraints_path(name)] = pins.read_bytes() if pins.is_file() else b""
    # The patch folder always exists in the context (COPY needs it), SERIES gives the order.
    files[f"{patch_dir(image)}/SERIES"] = "".join(f"{p}\n" for p in image.patches).encode()
    for patch in patch_files(image):
        files[str(patch.relative_to(root))] = patch.read_bytes()
    for extra in ("pyproject.toml", "README.md"):
        files[extra] = (root / extra).read_bytes()
    package = package_dir()  # the checkout's src/kimideploy, or the installed wheel's
    for path in sorted(package.rglob("*")):
        inside = path.relative_to(package)
        if (
            path.is_file()
            and path.suffix in SOURCE_SUFFIXES
            and "__pycache__" not in inside.parts
            and inside.parts[0] != "_share"
        ):
            files[f"src/kimideploy/{inside.as_posix()}"] = path.read_bytes()
    return files


def build_context(project: Project, name: str) -> BuildContext:
    files = context_files(project, name)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for arcname in sorted(files):
            data = files[arcname]
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode = (
                len(data),
                0,
                0o755 if arcname.endswith(".sh") else 0o644,
            )
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            archive.addfile(info, io.BytesIO(data))
    return BuildContext(name, buffer.getvalue(), tuple(sorted(files)))


def write_context(context: BuildContext, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{context.name}-{context.sha256[:12]}.tar"
    path.write_bytes(context.tar)
    return path
