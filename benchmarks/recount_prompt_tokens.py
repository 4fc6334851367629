"""Recount the built-in prompts' `tokens` with a running llama-server's /tokenize.

The committed counts were made with the Qwen2 tokenizer (the tiny test model's vocabulary):
    .venv/bin/python benchmarks/recount_prompt_tokens.py http://127.0.0.1:8080
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

import httpx

from quantload.load.shared_prefix import count_tokens


def main(argv: list[str]) -> int:
    url = argv[1]
    path = Path(str(resources.files("quantload").joinpath("data", "prompts.jsonl")))
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    with httpx.Client(timeout=30) as client:
        for row in rows:
            row["tokens"] = count_tokens(client, url, row["prompt"])
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    counts = sorted(row["tokens"] for row in rows)
    print(
        f"{len(rows)} prompts: min {counts[0]}, median {counts[len(counts) // 2]}, "
        f"p90 {counts[int(0.9 * len(counts))]}, max {counts[-1]}, total {sum(counts)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
