"""Reading kimideploy.yaml into a Project, with errors that name the file, line and dotted path."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Tag, ValidationError

from kimideploy.config import safe_yaml
from kimideploy.config.base import PATTERN_HELP
from kimideploy.config.project import Project, reference_issues
from kimideploy.errors import ConfigError
from kimideploy.paths import example_config_path

CONFIG_FILE_NAME = "kimideploy.yaml"


@dataclass(frozen=True)
class LoadedProject:
    """A validated project plus where it came from (for messages and the config hash)."""

    project: Project
    path: Path
    sha256: str
    text: str
    document: safe_yaml.Parsed
    """The text's values and their lines, as validated: read again (the placeholder checks)
    without parsing the file a second time."""


def default_config_path(cwd: Path | None = None) -> Path:
    """./kimideploy.yaml when present, else the built-in example."""
    local = (cwd or Path.cwd()) / CONFIG_FILE_NAME
    return local if local.is_file() else example_config_path()


def load_project(path: Path) -> LoadedProject:
    """Parse and validate a project file; every problem is reported at once, with its location."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read the project file ({exc.strerror})",
            hint="pass --config PATH, or run from a folder that has kimideploy.yaml",
        ) from exc
    try:
        text = safe_yaml.decode(raw)
    except safe_yaml.YamlError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise ConfigError(f"{where}: {exc.message}", hint="fix the file and retry") from exc
    return load_project_text(text, path)


def load_project_text(text: str, path: Path) -> LoadedProject:
    """Validate project text (a file's, or one stored in a release record); `path` names it."""
    document = _parse_yaml(path, text)
    data, lines = document.data, document.lines
    project = _validate(path, data, lines)
    issues = reference_issues(project)
    if issues:
        _raise(path, [_format(path, loc, message, lines) for loc, message in issues])
    digest = hashlib.sha256(text.encode()).hexdigest()
    return LoadedProject(project=project, path=path, sha256=digest, text=text, document=document)


def _parse_yaml(path: Path, text: str) -> safe_yaml.Parsed:
    """Values and the line of each dotted path; duplicate keys, alias bombs, deep nesting and
    unsafe tags are config errors with their line (config/safe_yaml.py)."""
    try:
        parsed = safe_yaml.load(text)
    except safe_yaml.YamlError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise ConfigError(f"{where}: {exc.message}", hint="fix the file and retry") from exc
    if not isinstance(parsed.data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return parsed


def _validate(path: Path, data: Any, lines: dict[Any, int]) -> Project:
    try:
        return Project.model_validate(data)
    except ValidationError as exc:
        messages = [
            _format(path, _clean_loc(err["loc"]), _message(err, data), lines)
            for err in exc.errors()
        ]
        _raise(path, messages)
    raise AssertionError("unreachable")


def _raise(path: Path, messages: list[str]) -> None:
    count = len(messages)
    summary = f"{path}: {count} problem{'s' if count != 1 else ''} in the project file"
    raise ConfigError(
        summary + "\n  " + "\n  ".join(messages),
        hint=f"fix {path.name} and run again; `kimideploy config schema` shows every key",
        issues=messages,
    )


def _is_union_member(part: Any) -> bool:
    # pydantic inserts the chosen union member (e.g. 'str' or 'literal[...]') into locations.
    return isinstance(part, str) and ("[" in part or part in {"str", "int"})


def _clean_loc(loc: Iterable[Any]) -> tuple[str | int, ...]:
    """The location as the user wrote it: without pydantic's union members, and without the
    tag of a tagged union (`drafters.v3.eagle3.x` is `drafters.v3.x` in the file)."""
    return tuple(part for part, _ in _resolve(loc)[0])


def _resolve(loc: Iterable[Any]) -> tuple[list[tuple[Any, Any]], Any]:
    """Walk a raw pydantic location from Project: ([(part, its parent's annotation)] for each part
    the user wrote, the annotation reached; None once a part is unknown). A tagged union's tag
    picks its member; pydantic's union-member parts are skipped."""
    parts: list[tuple[Any, Any]] = []
    annotation: Any = Project
    for part in loc:
        if _is_union_member(part):
            continue
        tagged = _tagged_members(annotation)
        if part in tagged:
            annotation = tagged[part]
            continue
        parts.append((part, annotation))
        annotation = _step(annotation, part) if annotation is not None else None
    return parts, annotation


def _tagged_members(annotation: Any) -> dict[str, Any]:
    """tag -> model for a tagged union (Annotated[A, Tag('a')] | ...), else empty."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) not in (Union, UnionType):
        return {}
    members = {}
    for member in get_args(annotation):
        if get_origin(member) is Annotated:
            base, *metadata = get_args(member)
            members.update({m.tag: base for m in metadata if isinstance(m, Tag)})
    return members


def _format(path: Path, loc: tuple[str | int, ...], message: str, lines: dict[Any, int]) -> str:
    line = _nearest_line(loc, lines)
    where = f"{path.name}:{line}" if line else path.name
    return f"{where}: {dotted(loc) or '(top level)'}: {message}"


def _nearest_line(loc: tuple[str | int, ...], lines: dict[Any, int]) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def dotted(loc: Iterable[str | int]) -> str:
    """drafters.v3.aux_layer_ids[2] style path."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(err: Any, data: Any) -> str:
    kind, ctx = err["type"], err.get("ctx", {})
    if kind == "extra_forbidden":
        return f"unknown key (valid keys here: {_valid_keys(err['loc'])})"
    if kind == "missing":
        return "required key is missing"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return _bounds_message(err["loc"]) or err["msg"].lower()
    if kind == "union_tag_invalid":
        return (
            f"method {ctx.get('tag')!r} is not one kimideploy serves (valid: "
            f"{ctx.get('expected_tags')}; see docs/usage/drafters.md's method table)"
        )
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        if pattern in PATTERN_HELP:
            return f"{err['input']!r} {PATTERN_HELP[pattern]}"
        return f"{err['input']!r} does not match the pattern {pattern}"
    message: str = err["msg"]
    return message.removeprefix("Value error, ")


def _walk_field(loc: Iterable[Any]) -> Any:
    """The pydantic FieldInfo at a raw pydantic location (None where it is not a model field)."""
    parts, _ = _resolve(loc)
    if not parts:
        return None
    part, parent = parts[-1]
    model = _unwrap(parent)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_fields.get(part)
    return None


def _step(annotation: Any, part: Any) -> Any:
    """The annotation one location part below `annotation` (None: not known)."""
    annotation = _unwrap(annotation)
    origin = get_origin(annotation)
    if origin is dict:
        return get_args(annotation)[1]
    if origin in (list, tuple):
        return get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(part)
        return field.annotation if field is not None else None
    return None


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the one type that matters."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
            continue
        members = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (Union, UnionType) and len(members) == 1:
            annotation = members[0]
            continue
        return annotation


def _inner_model(annotation: Any) -> Any:
    stack = [annotation]
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
        stack.extend(getattr(item, "__args__", ()))
    return None


def _valid_keys(loc: tuple[Any, ...]) -> str:
    model = _inner_model(_annotation_at(loc[:-1]))
    return ", ".join(model.model_fields) if model is not None else "?"


def _annotation_at(loc: Iterable[Any]) -> Any:
    """The annotation at a raw pydantic location (a tagged union resolved by its tag)."""
    return _resolve(loc)[1]


def _bounds_message(loc: tuple[Any, ...]) -> str | None:
    field = _walk_field(loc)
    if field is None:
        return None
    bounds: dict[str, float] = {}
    for meta in _all_metadata(field):
        for attr in ("ge", "gt", "le", "lt"):
            value = getattr(meta, attr, None)
            if value is not None:
                bounds[attr] = value
    low = bounds.get("ge", bounds.get("gt"))
    high = bounds.get("le", bounds.get("lt"))
    if low is not None and high is not None and "gt" not in bounds and "lt" not in bounds:
        return f"must be between {low:g} and {high:g}"
    if "gt" in bounds:
        return f"must be greater than {bounds['gt']:g}"
    if low is not None:
        return f"must be at least {low:g}"
    return f"must be at most {high:g}" if high is not None else None


def _all_metadata(field: Any) -> list[Any]:
    found = list(field.metadata)
    stack = [field.annotation]
    while stack:
        item = stack.pop()
        found.extend(getattr(item, "__metadata__", ()))
        stack.extend(getattr(item, "__args__", ()))
        for meta in getattr(item, "__metadata__", ()):
            found.extend(getattr(meta, "metadata", ()))
    return found
