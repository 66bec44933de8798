"""ORAS's error lines, as the user's next step. The lines are what ORAS v1.3.6 printed against the
test registry (tests/registry.py) in each situation."""

from __future__ import annotations

import pytest

from kimideploy.workloads.oci_artifacts import classify

REF = "registry.example/kimideploy/drafters/v4@sha256:ab"
UPLOAD = ('Error: Put "https://127.0.0.1:41293/v2/kimideploy/drafters/v4/blobs/uploads/01a2?_state='
          'Q8JhRrF4ChVv6dUJ2axV9WQKHdU9UtN5Vp5ljLJfYfV7Ik5hbWUiOiJraW1pZGVwbG95L2RyYWZ0ZXJzL3Y0I'
          'iwiVVVJRCI6IjAxYTIzODAzLTdhM2UtNzg0NC05ZGM3LTg4YzFlYWU5NjJjZiIsIk9mZnNldCI6MCwiU3RhcnRl'
          'ZEF0Ijoi&digest=sha256%3Aab&size=1": connection reset by peer')  # fmt: skip


@pytest.mark.parametrize(
    ("stderr", "said", "code"),
    [
        ("Error response from registry: unauthorized: authentication required: [map[Action:pull "
         "Class: Name:k/d Type:repository]]", "refused the credentials", 2),
        ('Error response from registry: HEAD "https://127.0.0.1:56739/v2/k/d/manifests/sha256:3f95'
         '": response status code 401: Unauthorized', "refused the credentials", 2),
        ("Error: basic credential not found", "refused the credentials", 2),
        ("Error response from registry: 127.0.0.1:56739/k/d@sha256:0000: not found",
         "is not in the registry", 2),
        ("Error: failed to copy content to /tmp/o3/model.safetensors: mismatched digest",
         "does not match its digest", 2),
        ('Error: Get "https://127.0.0.1:35827/v2/k/d/manifests/t": tls: failed to verify '
         "certificate: x509: certificate signed by unknown authority", "TLS certificate", 2),
        ('Error: Get "https://127.0.0.1:56739/v2/k/d/manifests/t": dial tcp 127.0.0.1:56739: '
         "connect: connection refused", "cannot reach the registry", 1),
        ('Error: Post "https://127.0.0.1:43657/v2/k/d/blobs/uploads/": http2: client connection '
         "force closed via ClientConn.Close", "cannot reach the registry", 1),
        (f"Uploading 8389a490fe25 model.safetensors\n{UPLOAD}", "cannot reach the registry", 1),
    ],
)  # fmt: skip
def test_each_oras_failure_is_named_for_what_to_do(stderr: str, said: str, code: int) -> None:
    error = classify(stderr, REF)
    assert said in str(error) and error.exit_code == code
    assert stderr.splitlines()[-1][:60] in str(error)  # ORAS's own words are kept
    assert error.hint


def test_a_network_failure_is_the_only_one_retried() -> None:
    """exit 1 is what push() retries; a refusal or a damaged blob would fail the same way again."""
    assert classify(UPLOAD, REF).exit_code == 1
    assert classify("Error: basic credential not found", REF).exit_code == 2
