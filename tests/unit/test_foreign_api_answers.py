"""A kubeconfig whose server is not a Kubernetes API server (a proxy, a wrong port, a login
portal): any such answer, 404, 502 or a 200 HTML page, is exit 3 naming the server and what
answered, never a traceback with the page in it. A real HTTP server on 127.0.0.1 answers."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from tests.conftest import EXAMPLE
from tests.local_http import answering

PAGE = (
    b"<html><head><title>Sign in - Corp Proxy</title></head><body>"
    + b"x" * 5000
    + b"</body></html>"
)


@pytest.fixture(params=[404, 502, 200])
def foreign_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    status = int(request.param)

    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "text/html")
        handler.send_header("Content-Length", str(len(PAGE)))
        handler.end_headers()
        handler.wfile.write(PAGE)

    with answering(respond) as address:
        yield f"http://{address}", status


def test_a_server_that_is_not_kubernetes_is_named_with_exit_3(
    foreign_server: tuple[str, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, status = foreign_server
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: rtx6000\n"
        f"clusters: [{{name: c, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: rtx6000, context: {cluster: c, user: u}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    for command in (["history", "serve"], ["status"], ["up", "serve", "--dry-run=server"]):
        code = main(["--config", str(EXAMPLE), *command])
        _, err = capsys.readouterr()
        assert code == 3, err
        assert f"{url} (context rtx6000) answered" in err
        assert "an HTML page titled 'Sign in - Corp Proxy'" in err
        assert (f"with {status} and" in err) == (status != 200)
        assert "Traceback" not in err and "xxxxx" not in err and "kubectl cluster-info" in err
