"""A CPU stand-in for the online-training target server (`vllm serve` with the extract_hidden_states
method and the ExampleHiddenStatesConnector), kept for what real vLLM cannot be made to do: serve
another model or other layers on purpose, vanish, or compute exactly the reference extraction's
numbers for step-for-step comparisons. The real server runs in tests/pipeline.

It takes the very flags plan/online.py renders for the real server (the model path,
--served-model-name, --port, --speculative-config, --kv-transfer-config; the rest is accepted and
ignored), computes the requested layers with the tiny model's own forward pass (vLLM id k < n: the
residual entering layer k; id n: the residual entering the final norm), writes them where the
connector writes them, in its layout and with vLLM 0.32's protocol (the `.lock` file beside each
file, held exclusively while writing, left for the client to remove), and answers /v1/completions
in the shape of vLLM's CompletionResponse.

Test-only flag: --record FILE appends each request body as a JSON line.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--speculative-config", required=True)
    parser.add_argument("--kv-transfer-config", required=True)
    parser.add_argument("--record")
    args, _ignored = parser.parse_known_args(argv)
    return args


class Extractor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        speculative = json.loads(args.speculative_config)
        assert speculative["method"] == "extract_hidden_states", speculative
        hf_config = speculative["draft_model_config"]["hf_config"]
        self.ids = hf_config["eagle_aux_hidden_state_layer_ids"]
        transfer = json.loads(args.kv_transfer_config)
        assert transfer["kv_connector"] == "ExampleHiddenStatesConnector", transfer
        self.storage = Path(transfer["kv_connector_extra_config"]["shared_storage_path"])
        self.storage.mkdir(parents=True, exist_ok=True)
        self.model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
        self.model.eval()
        self.layers = self.model.config.num_hidden_layers
        self.entering_norm: list[torch.Tensor] = []
        self.model.model.norm.register_forward_hook(
            lambda _m, inputs, _o: self.entering_norm.append(inputs[0])
        )
        self.lock = threading.Lock()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = body["prompt"]
        with self.lock, torch.no_grad():
            self.entering_norm.clear()
            out = self.model(torch.tensor([ids]), output_hidden_states=True)
            states = [
                self.entering_norm[0][0] if k == self.layers else out.hidden_states[k][0]
                for k in self.ids
            ]
            next_token = int(out.logits[0, -1].argmax())
        request_id = f"cmpl-{uuid.uuid4().hex}"
        path = self.storage / f"{request_id}.safetensors"
        with (self.storage / f"{request_id}.safetensors.lock").open("wb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            save_file({"hidden_states": torch.stack(states, dim=1).contiguous(),
                       "token_ids": torch.tensor(ids)}, str(path))  # fmt: skip
        echo = bool(body.get("return_token_ids"))
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                  "stop_reason": None, "prompt_logprobs": None,
                  "prompt_token_ids": ids if echo else None,
                  "token_ids": [next_token] if echo else None}  # fmt: skip
        return {"id": request_id, "object": "text_completion", "created": int(time.time()),
                "model": self.args.served_model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids) + 1,
                          "completion_tokens": 1},
                "kv_transfer_params": {"hidden_states_path": str(path)}}  # fmt: skip


def main(argv: list[str]) -> None:
    args = parse(argv)
    extractor = Extractor(args)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                entry = {"id": args.served_model_name, "object": "model", "owned_by": "vllm",
                         "root": args.model, "parent": None}  # fmt: skip
                self._send(200, {"object": "list", "data": [entry]})
            elif self.path == "/health":
                self._send(200, {})
            else:
                self._send(404, {"error": self.path})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if args.record:
                with Path(args.record).open("a") as record:
                    record.write(json.dumps(body) + "\n")
            if self.path != "/v1/completions":
                self._send(404, {"error": self.path})
            elif body.get("model") != args.served_model_name:
                self._send(404, {"error": f"The model `{body.get('model')}` does not exist."})
            else:
                self._send(200, extractor.complete(body))

        def log_message(self, *_: Any) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
