#!/usr/bin/env python3
"""Run inside a vLLM virtualenv: does this vLLM accept these `vllm serve` arguments?

Standalone (imports only vLLM and the standard library): `image verify` runs it with the pinned
vLLM's interpreter, the patched sources first on PYTHONPATH, and a JSON spec of cases
`[{"name": ..., "argv": [...]}]`. For each case it parses the arguments with vLLM's own server
parser and builds vLLM's engine configuration, the step that rejects a wrong speculative method,
unknown keys, a missing drafter or a target vLLM cannot speculate for. Prints one JSON list.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any


def use_cpu_platform() -> None:
    """Building the parser needs a platform; this machine has no GPU."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


# Only for building the config on a CPU machine without weights, and only where this vLLM has the
# flag: swap sized for this machine (not 4 GiB per GPU); the text model only, since the tiny
# Kimi-shaped target has no image processor (the real one is remote code in the checkpoint) and
# EAGLE-3 and extraction run on the text path. The tiny models come with a tiny tokenizer: vLLM
# 0.32 builds the reasoning and tool parsers from it while building the configuration.
VERIFY_ONLY_ARGS = (("--swap-space", "1"), ("--language-model-only",))


def serve_parser() -> Any:
    """`vllm serve`'s own argument parser (its module moved in vLLM 0.32)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM <= 0.31
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def draft_facts(config: Any) -> dict[str, Any]:
    """What vLLM decided about the drafter: whether its attention is treated as MLA."""
    speculative = getattr(config, "speculative_config", None)
    draft = getattr(speculative, "draft_model_config", None) if speculative else None
    if draft is None:
        return {}
    return {"draft_mla": bool(draft.is_deepseek_mla)}


def check(argv: list[str], expect: dict[str, Any] | None = None) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser = serve_parser()
    known = {flag for action in parser._actions for flag in action.option_strings}
    argv = [*argv, *(arg for extra in VERIFY_ONLY_ARGS if extra[0] in known for arg in extra)]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        return {"ok": False, "stage": "arguments", "error": lines[-1] if lines else "rejected"}
    try:
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    except Exception as exc:  # vLLM's own validation error is the answer we report
        message = str(exc).strip().splitlines()
        return {
            "ok": False,
            "stage": "engine config",
            "error": f"{type(exc).__name__}: " + (" ".join(message)[:600] if message else ""),
        }
    facts = draft_facts(config)
    wrong = {k: facts.get(k) for k, v in (expect or {}).items() if facts.get(k) != v}
    if wrong:
        return {
            "ok": False,
            "stage": "drafter",
            "error": f"vLLM built the configuration but decided {wrong}, expected {expect}: "
            "an MLA drafter read as non-MLA gets the wrong attention and KV cache layout",
        }
    return {"ok": True, "stage": "engine config", "error": ""}


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    use_cpu_platform()
    results = [{"name": case["name"], **check(case["argv"], case.get("expect"))} for case in cases]
    print("KIMIDEPLOY-RESULT " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
