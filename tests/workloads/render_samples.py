"""Render samples with kimideploy's renderer (run with the workloads venv's python):
`python render_samples.py MODEL_DIR SAMPLES.json` prints one JSON line per sample: ids, mask,
text, the masked span decoded, and the prompt's ids (the generation prompt's rendering)."""

import json
import sys
from pathlib import Path

from kimideploy.formats.chat_template import load_tokenizer, render_sample, template_messages

tokenizer = load_tokenizer(sys.argv[1])
for sample in json.loads(Path(sys.argv[2]).read_text()):
    rendered = render_sample(tokenizer, sample)
    trained = [t for t, m in zip(rendered.ids, rendered.loss_mask, strict=True) if m]
    print(
        json.dumps(
            {
                "id": sample["id"],
                "ids": rendered.ids,
                "mask": rendered.loss_mask,
                "text": rendered.text,
                "trained": tokenizer.decode(trained),
                "prompt_tokens": rendered.prompt_tokens,
                "prompt_messages": template_messages(sample["messages"]),
            }
        )
    )
