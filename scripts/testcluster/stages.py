"""KWOK stages for the test control plane: failure hooks chosen by pod annotations.

KWOK applies, of all stages whose selector matches, a weighted one over the weight-0 stages it
ships, so each hook stage overrides the upstream pod lifecycle for the pods that carry its
annotation. Templates hold no timestamps, so re-applying one changes nothing and the state holds.
"""

from __future__ import annotations

from typing import Any

# Test hooks: a test sets one of these annotations on a pod template.
NEVER_READY = "kimideploy.test/never-ready"  # "true": Running, never Ready
CRASH_LOOP = "kimideploy.test/crash-loop"  # "true": CrashLoopBackOff, restarts climbing
IMAGE_PULL_ERROR = "kimideploy.test/image-pull-error"  # "true": ImagePullBackOff, stays Pending
RUN_DURATION = "kimideploy.test/run-duration"  # Go duration a Job pod runs before it finishes
FAIL_INDEX = "kimideploy.test/fail-index"  # Job completion index whose pods fail (exit 1)
FAIL_EXIT_CODE = "kimideploy.test/fail-exit-code"  # the failing index's exit code (default 1)
FAIL_AFTER = (
    "kimideploy.test/fail-after"  # Go duration before that index fails (default: run-duration)
)
# A Job pod that must not finish before a test's PodHooks has given it its log: it runs (its
# run-duration has not started) until the hook removes this annotation. Without it, a loaded
# machine let a 1 s pod finish, and kimideploy read its log, before the hook's kubectl calls
# landed (CI: "bench run ... finished without a result line").
AWAIT_HOOK = "kimideploy.test/await-hook"

INDEX = "batch.kubernetes.io/job-completion-index"
HOOK_WEIGHT = 1_000_000  # KWOK picks a weighted stage over the weight-0 upstream ones


def _pod_stage(
    name: str, selector: list[dict[str, Any]], template: str, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    *selector,
                ]
            },
            "weight": HOOK_WEIGHT,
            "next": {"statusTemplate": template},
            **spec,
        },
    }


def _annotation(key: str, operator: str = "Exists") -> dict[str, Any]:
    return {"key": f'.metadata.annotations["{key}"]', "operator": operator}


def _phase(*phases: str) -> dict[str, Any]:
    return {"key": ".status.phase", "operator": "In", "values": list(phases)}


# Templates use no timestamps, so re-applying them is a no-op and the state holds still.
_WAITING = """
conditions:
- {{type: Ready, status: "False", reason: ContainersNotReady}}
- {{type: ContainersReady, status: "False", reason: ContainersNotReady}}
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  restartCount: {restarts}
  state: {{waiting: {{reason: {reason}, message: {message}}}}}
{lastState}
{{{{ end }}}}
phase: {phase}
"""
HOOK_STAGES = [
    _pod_stage(
        "kimideploy-test-image-pull-error",
        [_annotation(IMAGE_PULL_ERROR), _phase("Pending")],
        _WAITING.format(
            restarts=0,
            reason="ImagePullBackOff",
            lastState="",
            message='"Back-off pulling image: simulated pull failure (kimideploy test hook)"',
            phase="Pending",
        ),
    ),
    _pod_stage(
        "kimideploy-test-crash-loop",
        [_annotation(CRASH_LOOP), _phase("Pending", "Running")],
        _WAITING.format(
            restarts=5,
            reason="CrashLoopBackOff",
            phase="Running",
            message='"back-off 5m0s restarting failed container (kimideploy test hook)"',
            lastState="  lastState: {terminated: {exitCode: 1, reason: Error}}",
        ),
    ),
    _pod_stage(
        "kimideploy-test-never-ready",
        [_annotation(NEVER_READY), _phase("Pending", "Running")],
        """
conditions:
- {type: Ready, status: "False", reason: ContainersNotReady}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: true
  restartCount: 0
  state: {running: {startedAt: "2026-01-01T00:00:00Z"}}
{{ end }}
phase: Running
""",
    ),
    _pod_stage(
        "kimideploy-test-job-pod-await-hook",
        [
            _annotation(AWAIT_HOOK),
            _phase("Running"),
            {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
        ],
        "phase: Running\n",
    ),
    _pod_stage(
        "kimideploy-test-job-pod-finish",
        [
            _annotation(RUN_DURATION),
            _annotation(AWAIT_HOOK, "DoesNotExist"),
            _phase("Running"),
            {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
        ],
        """
{{ $index := index .metadata.annotations "batch.kubernetes.io/job-completion-index" }}
{{ $fail := index .metadata.annotations "kimideploy.test/fail-index" }}
{{ $failed := eq $index $fail }}
{{ $code := index .metadata.annotations "kimideploy.test/fail-exit-code" }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  state:
    terminated:
      exitCode: {{ if $failed }}{{ if $code }}{{ $code }}{{ else }}1{{ end }}{{ else }}0{{ end }}
      reason: {{ if $failed }}Error{{ else }}Completed{{ end }}
{{ end }}
phase: {{ if $failed }}Failed{{ else }}Succeeded{{ end }}
""",
        delay={
            "durationMilliseconds": 0,
            # The failing index may die early (a dead rank) while the others run on.
            "durationFrom": {
                "jq": {
                    "expression": (
                        f'.metadata.annotations as $a | if $a["{INDEX}"] == $a["{FAIL_INDEX}"] '
                        f'then ($a["{FAIL_AFTER}"] // $a["{RUN_DURATION}"]) '
                        f'else $a["{RUN_DURATION}"] end'
                    )
                }
            },
        },
    ),
]
