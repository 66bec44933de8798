"""Field descriptions come from attribute docstrings when a schema is written, by pydantic's rule,
and loading the config does not read any class's source."""

from __future__ import annotations

import inspect
import subprocess
import sys

from pydantic import BaseModel, ConfigDict

from kimideploy.config.descriptions import describe_from_docstrings


class Inner(BaseModel):
    size: int = 1
    """How big."""
    plain: int = 2

    def method(self) -> None:
        """Not a field's docstring."""


class Base(BaseModel):
    kept: str = "a"
    """Described where it is declared."""
    redeclared: str = "b"
    """The base's words."""


class Outer(Base):
    redeclared: str = "c"
    inner: Inner = Inner()
    """The inner part."""
    by_name: dict[str, Inner] = {}
    maybe: Inner | None = None
    """Perhaps."""


class Described(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
    size: int = 1
    """How big."""
    plain: int = 2


def test_descriptions_follow_pydantics_own_rule_and_reach_nested_schemas() -> None:
    describe_from_docstrings(Outer)
    fields = Outer.model_fields
    assert fields["kept"].description == "Described where it is declared."
    assert fields["redeclared"].description is None  # re-declared without a docstring
    assert fields["inner"].description == "The inner part."
    assert fields["maybe"].description == "Perhaps."
    assert Inner.model_fields["size"].description == "How big."
    assert Inner.model_fields["plain"].description is None
    schema = Outer.model_json_schema()
    assert schema["$defs"]["Inner"]["properties"]["size"]["description"] == "How big."
    # The same schema pydantic writes when it reads the docstrings itself.
    assert schema["$defs"]["Inner"] == {**Described.model_json_schema(), "title": "Inner"}


def test_loading_and_rendering_read_no_class_source() -> None:
    """What start-up no longer pays for: pydantic's docstring reading finds each class's source."""
    probe = (
        "import inspect, sys\n"
        "calls = []\n"
        "real = inspect.getsourcelines\n"
        "inspect.getsourcelines = lambda o: calls.append(o) or real(o)\n"
        "real_block = inspect.getblock\n"
        "inspect.getblock = lambda lines: calls.append('block') or real_block(lines)\n"
        "from kimideploy.services.rendering import render_workload\n"
        "import kimideploy.config.project, kimideploy.config.specs\n"
        "print(len(calls))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stdout
    assert inspect.getsource(describe_from_docstrings)  # the schema path still can
