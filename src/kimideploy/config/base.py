"""Shared building blocks of the config models: strictness, names, quantities, digests."""

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

_QUANTITY = re.compile(
    r"^(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_BINARY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIX = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}


class StrictModel(BaseModel):
    """User-written config: unknown keys are errors, values are immutable once loaded."""

    # Attribute docstrings are the fields' descriptions: config/descriptions.py reads them when
    # the schema and docs/reference/configuration-keys.md are written, not while classes load.
    # defer_build: a model's validator is built when it first validates, not when its class is
    # defined; a command builds only the models it reads (`render serve` a sixth less CPU).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, defer_build=True)


def is_quantity(value: str) -> bool:
    """True when value is a Kubernetes resource quantity such as 500Gi, 64, 1.5, 250m or 1e3."""
    return bool(_QUANTITY.match(value))


def quantity_to_float(value: str) -> float:
    """The numeric value of a quantity in base units (bytes for memory, cores for cpu)."""
    if not is_quantity(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    match = re.match(r"^([0-9.]+)(.*)$", value)
    assert match is not None
    number, suffix = float(match.group(1)), match.group(2)
    if suffix in _BINARY_SUFFIX:
        return number * _BINARY_SUFFIX[suffix]
    if suffix in _DECIMAL_SUFFIX:
        return number * _DECIMAL_SUFFIX[suffix]
    return float(value)


def _check_quantity(value: str) -> str:
    if not is_quantity(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: 500Gi, 64, 250m)")
    return value


Quantity = Annotated[str, AfterValidator(_check_quantity)]
"""A Kubernetes quantity string, checked at load time so the error names the config path."""

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?$")]
"""A DNS-label-like name usable in Kubernetes object names and labels."""

# Kubernetes' own syntax (apimachinery validation), checked when the file is loaded so the error
# names the config path instead of the API server refusing one object in the middle of an apply.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"

DnsLabel = Annotated[str, StringConstraints(pattern=rf"^{_DNS_LABEL}$")]
"""A namespace name: lower-case alphanumerics and '-', at most 63, no dots."""
DnsSubdomain = Annotated[str, StringConstraints(max_length=253, pattern=rf"^{_DNS_SUBDOMAIN}$")]
"""A Secret (or most objects') name."""
QualifiedName = Annotated[
    str, StringConstraints(max_length=317, pattern=rf"^({_DNS_SUBDOMAIN}/)?{_NAME_PART}$")
]
"""A label, annotation or toleration key: an optional DNS prefix and '/', then a name part."""
LabelValue = Annotated[str, StringConstraints(pattern=rf"^({_NAME_PART})?$")]
SecretKey = Annotated[str, StringConstraints(pattern=r"^[-._a-zA-Z0-9]{1,253}$")]

PATTERN_HELP = {
    f"^{_DNS_LABEL}$": "is not a valid Kubernetes namespace name (lower-case letters, digits and "
    "'-', at most 63 characters, no dots)",
    f"^{_DNS_SUBDOMAIN}$": "is not a valid Kubernetes object name (lower-case letters, digits, "
    "'-' and '.')",
    rf"^({_DNS_SUBDOMAIN}/)?{_NAME_PART}$": "is not a valid Kubernetes label or annotation key "
    "(an optional DNS prefix and '/', then letters, digits, '-', '_' or '.', at most 63)",
    rf"^({_NAME_PART})?$": "is not a valid Kubernetes label value (letters, digits, '-', '_' or "
    "'.', at most 63, starting and ending alphanumeric)",
    r"^[-._a-zA-Z0-9]{1,253}$": "is not a valid Secret key (letters, digits, '-', '_' or '.')",
}
"""What a user reads instead of the regular expression when a value breaks Kubernetes' syntax."""

Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
"""An OCI content digest; images are only ever referenced by digest."""

GitRevision = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
"""A full 40-hex commit of a Hugging Face repository; branches are not pins."""

Port = Annotated[int, Field(ge=1, le=65535)]


def _check_cidr(value: str) -> str:
    import ipaddress

    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a network in CIDR notation ({exc})") from None
    return value


Cidr = Annotated[str, AfterValidator(_check_cidr)]
"""An IPv4 or IPv6 network such as 10.0.0.0/16 (host bits zero), as NetworkPolicy ipBlock takes."""
