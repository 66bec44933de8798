"""The JSON Schema (2020-12) that Kubernetes' OpenAPI schemas and the shipped CRD schemas use.

Why not the jsonschema package: importing it (with referencing, attrs, rpds and the bundled
metaschemas) cost more CPU than the rest of `kimideploy render` put together, to apply about ten
keywords. This module applies those keywords with the messages jsonschema gives, so an error
reads the same as before; tests hold it to jsonschema on every rendered kind, good and broken,
and walk every shipped schema for keywords it does not know (a newer schema package using one
fails those tests, not a user's render silently).

References are local (`#/$defs/<name>`): the schemas this reads are self-contained (schema.py).
`format` is an annotation, as in jsonschema without a format checker; Kubernetes checks formats
(quantities, label values) are render/checks.py's job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from kimideploy.errors import ManifestError

Schema = dict[str, Any] | bool
Path = tuple[str | int, ...]
Error = tuple[Path, str]
"""Where in the instance (keys and list indexes) and what jsonschema would say."""

ANNOTATIONS = frozenset(
    {"description", "format", "$schema", "$id", "$defs", "$comment", "title", "default"}
)
"""Keywords that assert nothing (x-kubernetes-* extensions are annotations too)."""


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


TYPE_TESTS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _equal(one: Any, two: Any) -> bool:
    """JSON equality: true is not 1, false is not 0, at any depth."""
    if isinstance(one, bool) or isinstance(two, bool):
        return isinstance(one, bool) and isinstance(two, bool) and one == two
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(_equal(a, b) for a, b in zip(one, two, strict=True))
    if isinstance(one, dict) and isinstance(two, dict):
        return one.keys() == two.keys() and all(_equal(one[k], two[k]) for k in one)
    return bool(one == two)


class SchemaValidator:
    """One self-contained schema; `errors(instance)` yields every violation jsonschema would."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.definitions: dict[str, Any] = schema.get("$defs", {})

    def errors(self, instance: Any) -> list[Error]:
        return list(self._check(instance, self.schema, ()))

    def is_valid(self, instance: Any, schema: Schema) -> bool:
        return next(self._check(instance, schema, ()), None) is None

    def _check(self, instance: Any, schema: Schema, path: Path) -> Iterator[Error]:
        if schema is True:
            return
        if schema is False:
            yield path, f"False schema does not allow {instance!r}"
            return
        for keyword, value in schema.items():
            if keyword in ANNOTATIONS or keyword.startswith("x-kubernetes-"):
                continue
            check = KEYWORDS.get(keyword)
            if check is None:
                raise _unsupported(f"the keyword {keyword!r}")
            yield from check(self, value, instance, schema, path)

    def resolve(self, reference: str) -> Schema:
        prefix = "#/$defs/"
        if not reference.startswith(prefix) or reference[len(prefix) :] not in self.definitions:
            raise _unsupported(f"the reference {reference!r}")
        resolved: Schema = self.definitions[reference[len(prefix) :]]
        return resolved


def _unsupported(what: str) -> ManifestError:
    return ManifestError(
        f"the OpenAPI schema uses {what}, which kimideploy's validator does not apply",
        hint="install the kubernetes-validate version kimideploy pins (pyproject.toml), "
        "or report a bug naming that version",
    )


Keyword = Callable[[SchemaValidator, Any, Any, dict[str, Any], Path], Iterator[Error]]


def _ref(
    v: SchemaValidator, ref: str, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    yield from v._check(instance, v.resolve(ref), path)


def _type(
    v: SchemaValidator, types: Any, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    names = [types] if isinstance(types, str) else list(types)
    if not any(TYPE_TESTS[name](instance) for name in names):
        yield path, f"{instance!r} is not of type {', '.join(repr(n) for n in names)}"


def _properties(
    v: SchemaValidator, properties: dict[str, Any], instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, dict):
        for name, subschema in properties.items():
            if name in instance:
                yield from v._check(instance[name], subschema, (*path, name))


def _additional_properties(
    v: SchemaValidator, allowed: Schema, instance: Any, schema: dict[str, Any], path: Path
) -> Iterator[Error]:
    if not isinstance(instance, dict):
        return
    if "patternProperties" in schema:
        raise _unsupported("the keyword 'patternProperties'")
    known = schema.get("properties", {})
    extras = [name for name in instance if name not in known]
    if isinstance(allowed, dict):
        for name in extras:
            yield from v._check(instance[name], allowed, (*path, name))
    elif not allowed and extras:
        names = sorted(extras, key=str)
        verb = "was" if len(names) == 1 else "were"
        listed = ", ".join(repr(n) for n in names)
        yield path, f"Additional properties are not allowed ({listed} {verb} unexpected)"


def _items(
    v: SchemaValidator, items: Schema, instance: Any, schema: dict[str, Any], path: Path
) -> Iterator[Error]:
    if "prefixItems" in schema:
        raise _unsupported("the keyword 'prefixItems'")
    if not isinstance(instance, list) or not instance:
        return
    if items is False:
        rest = instance if len(instance) != 1 else instance[0]
        yield path, f"Expected at most 0 items but found {len(instance)} extra: {rest!r}"
        return
    for index, item in enumerate(instance):
        yield from v._check(item, items, (*path, index))


def _required(
    v: SchemaValidator, required: list[str], instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, dict):
        for name in required:
            if name not in instance:
                yield path, f"{name!r} is a required property"


def _enum(
    v: SchemaValidator, options: list[Any], instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if not any(_equal(option, instance) for option in options):
        yield path, f"{instance!r} is not one of {options!r}"


def _const(
    v: SchemaValidator, const: Any, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if not _equal(const, instance):
        yield path, f"{const!r} was expected"


def _pattern(
    v: SchemaValidator, pattern: str, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, str) and not re.search(pattern, instance):
        yield path, f"{instance!r} does not match {pattern!r}"


def _min_items(
    v: SchemaValidator, least: int, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, list) and len(instance) < least:
        yield path, f"{instance!r} {'should be non-empty' if least == 1 else 'is too short'}"


def _max_items(
    v: SchemaValidator, most: int, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, list) and len(instance) > most:
        yield path, f"{instance!r} is too long"


def _min_length(
    v: SchemaValidator, least: int, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, str) and len(instance) < least:
        yield path, f"{instance!r} {'should be non-empty' if least == 1 else 'is too short'}"


def _max_length(
    v: SchemaValidator, most: int, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, str) and len(instance) > most:
        yield path, f"{instance!r} is too long"


def _number(instance: Any) -> bool:
    return isinstance(instance, (int, float)) and not isinstance(instance, bool)


def _minimum(
    v: SchemaValidator, least: float, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if _number(instance) and instance < least:
        yield path, f"{instance!r} is less than the minimum of {least!r}"


def _maximum(
    v: SchemaValidator, most: float, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if _number(instance) and instance > most:
        yield path, f"{instance!r} is greater than the maximum of {most!r}"


def _min_properties(
    v: SchemaValidator, least: int, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, dict) and len(instance) < least:
        message = "should be non-empty" if least == 1 else "does not have enough properties"
        yield path, f"{instance!r} {message}"


def _max_properties(
    v: SchemaValidator, most: int, instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    if isinstance(instance, dict) and len(instance) > most:
        yield path, f"{instance!r} has too many properties"


def _one_of(
    v: SchemaValidator, options: list[Schema], instance: Any, _: dict[str, Any], path: Path
) -> Iterator[Error]:
    matching = [option for option in options if v.is_valid(instance, option)]
    if not matching:
        yield path, f"{instance!r} is not valid under any of the given schemas"
    elif len(matching) > 1:
        # jsonschema names the later matches first, then the first one.
        named = [*matching[1:], matching[0]]
        yield path, f"{instance!r} is valid under each of {', '.join(repr(s) for s in named)}"


KEYWORDS: dict[str, Keyword] = {
    "$ref": _ref,
    "type": _type,
    "properties": _properties,
    "additionalProperties": _additional_properties,
    "items": _items,
    "required": _required,
    "enum": _enum,
    "const": _const,
    "pattern": _pattern,
    "minItems": _min_items,
    "maxItems": _max_items,
    "minLength": _min_length,
    "maxLength": _max_length,
    "minimum": _minimum,
    "maximum": _maximum,
    "minProperties": _min_properties,
    "maxProperties": _max_properties,
    "oneOf": _one_of,
}
"""Every assertion keyword the shipped schemas use; any other one is refused, not ignored."""
