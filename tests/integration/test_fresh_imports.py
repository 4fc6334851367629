"""What importing a part of quantload costs, seen in a fresh interpreter (a child Python, so these
left the unit tier): the report, the load package's face and `quantload --help` import only what
they need.

From tests/unit: analysis/test_analysis_report.py, load/test_load_face.py, test_cli_start_here.py
and test_rundir.py keep the rest of those checks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from quantload.cli.commands import COMMANDS

pytestmark = pytest.mark.integration


def test_importing_the_package_has_no_side_effects() -> None:
    code = "import sys, quantload.analysis, quantload.cli.cmd_report; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_report_does_not_import_the_run_orchestration() -> None:
    code = (
        "import pkgutil, importlib, sys, quantload.analysis as a\n"
        "for m in pkgutil.walk_packages(a.__path__, 'quantload.analysis.'): importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n.startswith('quantload.stack')))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert shown.stdout.strip() == "[]"


def test_a_name_of_the_load_face_costs_only_its_own_module() -> None:
    code = (
        "import sys\n"
        "from quantload.load.records import RequestRecord\n"
        "assert 'quantload.load.supervisor' not in sys.modules, 'the supervisor was imported'\n"
        "assert 'quantload.load.fakeserver' not in sys.modules, 'the fake server was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_top_help_imports_no_subcommand_and_no_heavy_library() -> None:
    probe = (
        "import sys, json\n"
        "from quantload.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    heavy = {"pandas", "scipy", "numpy", "matplotlib", "pydantic", "locust", "docker", "quantload.config"}
    assert not heavy & loaded, f"quantload --help imported {sorted(heavy & loaded)}"
    assert not {f"quantload.cli.{entry.module}" for entry in COMMANDS} & loaded
