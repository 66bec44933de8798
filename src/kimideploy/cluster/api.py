"""A thin REST client over the kubernetes package's configuration and connection pool.

Raw JSON instead of generated models: kimideploy applies whole rendered objects, and the
generated models silently drop unknown fields. Connection and authorization failures become
ClusterError (exit 3) naming the verb, resource and namespace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from kimideploy.errors import ClusterError

FIELD_MANAGER = "kimideploy"


class NotFoundError(Exception):
    """The object does not exist (404)."""


class ForbiddenError(ClusterError):
    """The API server refused the caller (401/403): RBAC, not the object."""


class ConflictError(Exception):
    """409: an apply conflict or an object that already exists; `status` is the API's Status."""

    def __init__(self, status: dict[str, Any]) -> None:
        super().__init__(status.get("message", "conflict"))
        self.status = status


class InvalidError(Exception):
    """422 or 400: the API server rejected the object; `message` is its reason."""

    def __init__(self, message: str, status: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status


class KubeApi:
    """One connection to one cluster context."""

    def __init__(self, context: str | None = None, kubeconfig: str | None = None) -> None:
        from kubernetes import config as kube_config
        from kubernetes.client import Configuration

        configuration = Configuration()
        # The package reads KUBECONFIG once at import; read it per connection instead.
        config_file = kubeconfig or os.environ.get("KUBECONFIG") or None
        try:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=config_file, context=context, client_configuration=configuration
            )
        except kube_config.ConfigException as exc:
            raise ClusterError(
                f"cannot use kube context {context or '(current)'}: {exc}",
                hint="check KUBECONFIG and `kubectl config get-contexts`, or pass --context NAME",
            ) from exc
        except FileNotFoundError as exc:
            raise ClusterError(f"no kubeconfig: {exc}", hint="set KUBECONFIG") from exc
        configuration.retries = 1  # an unreachable cluster should fail in seconds, not minutes
        from kubernetes.client import ApiClient

        self.client = ApiClient(configuration=configuration)
        self.context = context
        self.host = configuration.host

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30,
    ) -> Any:
        """Send one request and return the decoded JSON body; raise on failure."""
        response = self._send(method, path, query, body, content_type, timeout)
        data = response.read()
        if 200 <= response.status < 300:
            if data and data[:1] in (b"{", b"["):
                return json.loads(data)
            if data.lstrip()[:1] == b"<":  # a login page or a proxy's portal answering 200
                raise self._foreign(method, path, _what_answered(data))
            return data
        self._raise(method, path, response.status, data)
        raise AssertionError("unreachable")

    def server_time(self) -> datetime:
        """The API server's clock (its Date header, to the second): what lease expiry and
        stored timestamps are judged against, never this machine's clock."""
        response = self._send("GET", "/version", None, None, None, 30)
        response.read()
        stamp = response.headers.get("Date")
        try:
            return parsedate_to_datetime(stamp).astimezone(UTC)
        except (TypeError, ValueError) as exc:
            raise ClusterError(
                f"the API server at {self.host} sent no usable Date header ({stamp!r})",
                hint="kimideploy judges lease expiry by the API server's clock",
            ) from exc

    def text(self, path: str, query: dict[str, Any] | None = None, timeout: float = 30) -> str:
        response = self._send("GET", path, query, None, None, timeout)
        data = response.read()
        if response.status != 200:
            self._raise("GET", path, response.status, data)
        return bytes(data).decode("utf-8", "replace")

    def stream_lines(self, path: str, query: dict[str, Any] | None = None) -> Iterator[str]:
        """Lines of a streamed response (followed logs); ends when the server closes it."""
        response = self._send("GET", path, query, None, None, None)
        if response.status != 200:
            self._raise("GET", path, response.status, response.read())
        buffer = b""
        for chunk in response.response.stream(4096):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                yield line.decode("utf-8", "replace")
        if buffer:
            yield buffer.decode("utf-8", "replace")

    def _send(
        self, method: str, path: str, query: Any, body: Any, content_type: str | None, timeout: Any
    ) -> Any:
        import urllib3

        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        serialized = self.client.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        method, url, headers, body = serialized[0], serialized[1], serialized[2], serialized[3]
        try:
            return self.client.rest_client.request(  # type: ignore[no-untyped-call]
                method, url, headers=headers, body=body, _request_timeout=timeout
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ClusterError(
                f"cannot reach the cluster at {self.host} (context {self.context}): {exc}",
                hint="is the API server up and the context right? try `kubectl cluster-info`",
            ) from exc
        except Exception as exc:
            if type(exc).__name__ == "ApiException":
                raise ClusterError(f"cannot talk to {self.host}: {exc}") from exc
            raise

    def _foreign(self, method: str, path: str, answer: str) -> ClusterError:
        return ClusterError(
            f"{self.host} (context {self.context or '(current)'}) answered {method} {path} with "
            f"{answer}: that is not a Kubernetes API server",
            hint="a proxy, a wrong port or another service answered: check the context's "
            "`server:` in your kubeconfig and run `kubectl cluster-info`",
        )

    def _raise(self, method: str, path: str, status: int, data: bytes) -> None:
        try:
            body = json.loads(data)
        except ValueError:
            body = {"message": bytes(data).decode("utf-8", "replace")}
        if not _from_kubernetes(body, data):
            raise self._foreign(method, path, f"{status} and {_what_answered(data)}")
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        if status == 404:
            raise NotFoundError(message)
        if status == 409:
            raise ConflictError(body)
        if status in (400, 422):
            raise InvalidError(message, body)
        if status in (401, 403):
            verb = {
                "GET": "get",
                "POST": "create",
                "PATCH": "patch",
                "PUT": "update",
                "DELETE": "delete",
            }.get(method, method.lower())
            raise ForbiddenError(
                f"forbidden: cannot {verb} {_describe(path)}: {message}",
                hint="ask a cluster admin for that permission, or use a context that has it",
            )
        raise ClusterError(f"{method} {path} failed ({status}): {message}")


GO_NOT_FOUND = b"404 page not found"
"""What the API server's Go mux answers for a path outside every API group (no Status there)."""


def _from_kubernetes(body: Any, data: bytes) -> bool:
    """The API server answers every failure with a Status object (or, for a path no API serves,
    Go's plain not-found line); anything else came from something in front of it."""
    if isinstance(body, dict) and body.get("kind") == "Status":
        return True
    return bytes(data).strip() == GO_NOT_FOUND


def _what_answered(data: bytes) -> str:
    """A short, printable description of a foreign answer: an HTML page's title, else its
    first words (never the whole page)."""
    text = bytes(data).decode("utf-8", "replace")
    lowered = text.lower()
    if "<title>" in lowered and "</title>" in lowered:
        start = lowered.index("<title>") + len("<title>")
        title = " ".join(text[start : lowered.index("</title>", start)].split())
        return f"an HTML page titled {title[:120]!r}"
    if lowered.lstrip().startswith("<"):
        return "an HTML page"
    words = " ".join(text.split())
    return f"{words[:120]!r}" if words else "an empty body"


def _describe(path: str) -> str:
    parts = path.strip("/").split("/")
    if "namespaces" in parts and parts.index("namespaces") + 2 < len(parts):
        index = parts.index("namespaces")
        return f"{parts[index + 2]} in namespace {parts[index + 1]}"
    return parts[-1] if parts else path
