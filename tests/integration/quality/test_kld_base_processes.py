"""Base logits files of processes that died are removed, others kept (a child Python gives a pid
that is surely gone).

Moved from tests/unit/quality/test_kld_base.py, whose other tests start no process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.llamacpp import kld_base

pytestmark = pytest.mark.integration


def test_files_of_processes_that_died_are_removed_and_others_kept(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    dead_tag, own_tag = kld_base.owner_tag(int(dead.stdout)), kld_base.owner_tag()
    names = {
        f"0123abcd-{dead_tag}-beef.logits": False,  # used once by a process that is gone
        f".0123abcd.logits.{dead_tag}.partial": False,  # being written by it
        f"0123abcd-{own_tag}-beef.logits": True,  # ours
        f".0123abcd.logits.{own_tag}.partial": True,
        f"0123abcd-{dead.stdout.strip()}@another-host.example-beef.logits": True,  # another machine's
        f".0123abcd.logits.{dead.stdout.strip()}@another-host.example.partial": True,
        "0123abcd.logits": True,  # kept on purpose
        "0123abcd.json": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = kld_base.remove_orphans(tmp_path)
    assert sorted(path.name for path in removed) == sorted(name for name, kept in names.items() if not kept)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(name for name, kept in names.items() if kept)
    assert kld_base.partial_name("b.logits", 42) == f".b.logits.{kld_base.owner_tag(42)}.partial"
    assert own_tag == f"{os.getpid()}@{own_tag.split('@')[1]}"
