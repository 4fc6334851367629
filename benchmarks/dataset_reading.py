"""How long a big ShareGPT JSON list takes before the load sends its first request, and the memory.

The public ShareGPT file (ShareGPT_V3_unfiltered_cleaned_split.json) is about 670 MB: a JSON list
of some 94,000 conversations, pretty-printed. This writes a file of that shape and size (generated
conversations, English and some non-ASCII text, `--megabytes`), starts the fake server, runs

    quantload load --url FAKE --workload dataset --dataset FILE --users 1 --repeats 1 ...

and prints the seconds until records.jsonl holds its first request (the whole start: reading the
dataset, planning, starting Locust), the seconds the command took in all, its peak resident memory
(the largest of quantload and its Locust process), and the progress lines it printed while it read
the file. It also times `read_dataset` alone in this process (peak memory from tracemalloc).

    .venv/bin/python benchmarks/dataset_reading.py                  # 670 MB, about a minute
    .venv/bin/python benchmarks/dataset_reading.py --megabytes 41   # the tour's 65,738-entry case
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from quantload.load.datasets import read_dataset
from quantload.load.fakeserver import FakeScript, FakeServerProcess

WORDS_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from or"
    " one had by word but not what all were we when your can said there use an each which she do"
    " how their if will up other about out many then them these so some her would make like him"
    " into time has look two more write go see number no way could people my than first water"
    " 模型 量化 服务器 请求 延迟 データ モデル 요청 сервер запрос"
)
WORDS = WORDS_TEXT.split()


def conversation(rng: random.Random, index: int) -> dict[str, object]:
    """One ShareGPT entry: a few human/gpt turns of generated text."""
    turns = []
    for turn in range(rng.randint(1, 4)):
        for side in ("human", "gpt"):
            words = rng.randint(8, 120) if side == "human" else rng.randint(60, 700)
            turns.append({"from": side, "value": " ".join(rng.choices(WORDS, k=words))})
        del turn
    return {"id": f"conv{index:07d}", "conversations": turns}


def write_file(path: Path, megabytes: float, seed: int = 0) -> int:
    """A pretty-printed JSON list of about `megabytes` MB; returns the entries written."""
    rng = random.Random(seed)
    templates = [json.dumps(conversation(rng, 0), indent=2, ensure_ascii=False) for _ in range(200)]
    target = int(megabytes * 1e6)
    written, count = 0, 0
    with path.open("w", encoding="utf-8") as handle:
        handle.write("[\n")
        while written < target:
            text = templates[count % len(templates)].replace("conv0000000", f"conv{count:07d}", 1)
            handle.write((",\n" if count else "") + text)
            written += len(text.encode("utf-8")) + 2
            count += 1
        handle.write("\n]\n")
    return count


def run_load(dataset: Path, folder: Path) -> dict[str, object]:
    """`quantload load` with the dataset workload against the fake server; its timings and memory."""
    quantload = Path(sys.executable).with_name("quantload")
    out = folder / "out"
    with FakeServerProcess(FakeScript(ttft_ms=(5.0, 10.0), itl_ms=(1.0, 2.0), tokens=4)) as fake:
        command = [
            str(quantload), "load", "--url", fake.url, "--out", str(out), "--workload", "dataset",
            "--dataset", str(dataset), "--users", "1", "--repeats", "1", "--prompt-count", "4",
            "--max-tokens", "4", "--metrics-port", "0",
        ]  # fmt: skip
        started = time.monotonic()
        log = (folder / "load.log").open("w+", encoding="utf-8")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        first_request_s = None
        records = out / "records.jsonl"
        while process.poll() is None:
            if first_request_s is None and records.is_file() and records.stat().st_size > 0:
                first_request_s = time.monotonic() - started
            time.sleep(0.05)
        total_s = time.monotonic() - started
        if first_request_s is None and records.is_file() and records.stat().st_size > 0:
            first_request_s = total_s
    log.seek(0)
    output = log.read()
    log.close()
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "exit": process.returncode,
        "first_request_s": first_request_s,
        "total_s": total_s,
        "peak_rss_mb": peak_kib * 1024 / 1e6,
        "progress_lines": [line for line in output.splitlines() if "reading" in line][:3],
        "output_tail": output.strip().splitlines()[-4:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--megabytes", type=float, default=670.0)
    parser.add_argument("--keep", type=Path, default=None, help="write the file here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ql-dataset-") as tmp:
        folder = Path(tmp)
        dataset = args.keep or folder / "sharegpt.json"
        started = time.monotonic()
        entries = write_file(dataset, args.megabytes)
        size = dataset.stat().st_size
        print(
            f"file: {size / 1e6:.0f} MB, {entries:,} conversations,"
            f" written in {time.monotonic() - started:.0f} s"
        )
        tracemalloc.start()
        started = time.monotonic()
        heard: list[str] = []
        read = read_dataset(dataset, lambda done, total, note="": heard.append(note))
        read_s = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(
            f"read_dataset alone: {read_s:.1f} s ({size / 1e6 / read_s:.0f} MB/s),"
            f" {len(read.conversations):,} conversations, peak Python memory {peak / 1e6:.0f} MB"
        )
        del read
        for note in (heard[1], heard[len(heard) // 2], heard[-1]) if len(heard) > 2 else heard:
            print(f"  progress line: {note}")
        found = run_load(dataset, folder)
        print(
            f"quantload load: first request after {found['first_request_s']:.1f} s, exit {found['exit']}"
            f" after {found['total_s']:.1f} s, peak resident memory {found['peak_rss_mb']:.0f} MB"
        )
        for line in found["progress_lines"]:  # type: ignore[attr-defined]
            print("  progress:", line.strip()[:150])
        for line in found["output_tail"]:  # type: ignore[attr-defined]
            print("  output:", line.strip()[:150])
    return 0


if __name__ == "__main__":
    sys.exit(main())
