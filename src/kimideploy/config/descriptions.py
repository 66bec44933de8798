"""Field descriptions from attribute docstrings, read when a schema is written, not at start-up.

A field's description is the string literal written right after its annotation in the class that
declares it. pydantic can read these itself (`use_attribute_docstrings`), but it does so while each
class is created, by finding and parsing the class's source: a fifth of every command's start-up,
for text only `config schema` and the generated key reference print. This reads them by the same
rule, once, when a schema is asked for, and rebuilds the models so their schemas carry them.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import typing

from pydantic import BaseModel


def describe_from_docstrings(root: type[BaseModel]) -> None:
    """Give every field reachable from root the description its docstring holds."""
    visited: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel]) -> None:
        if model in visited:
            return
        visited.add(model)
        for field in model.model_fields.values():
            for nested in _models_in(field.annotation):
                visit(nested)
        for name, field in model.model_fields.items():
            if field.description is None:
                field.description = _declared_docstring(model, name)
        # After the models it nests, so its schema is built from their described ones.
        model.model_rebuild(force=True)

    visit(root)


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _declared_docstring(model: type[BaseModel], name: str) -> str | None:
    # The class that declares the annotation owns the docstring; a subclass that re-declares a
    # field without one leaves it undescribed, as pydantic does.
    for klass in model.__mro__:
        if name in inspect.get_annotations(klass):
            return _docstrings(klass).get(name)
    return None


@functools.cache
def _docstrings(klass: type) -> dict[str, str]:
    try:
        source = inspect.getsource(klass)
    except (OSError, TypeError):  # no source shipped: the schema goes without descriptions
        return {}
    [definition] = ast.parse(textwrap.dedent(source)).body
    assert isinstance(definition, ast.ClassDef)
    found: dict[str, str] = {}
    for statement, following in zip(definition.body, definition.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found
