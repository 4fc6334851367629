"""Files kept at the repository's top level that the package reads: prometheus/ and analysis/.

A built wheel carries copies of them under `quantload/_assets/` (setup.py's build step puts them
there); a source checkout or an editable install reads them where they stand.
"""

from __future__ import annotations

from pathlib import Path

from quantload.errors import QuantloadError

PACKAGED_DIR = "_assets"
# What setup.py copies into a wheel, relative to the repository root.
PACKAGED_FILES = (
    "prometheus/prometheus.yml",
    "prometheus/rules/quantload.rules.yml",
    "prometheus/rules/quantload.alerts.yml",
    "analysis/report_template.html",
)


def asset_dir(name: str) -> Path:
    """The folder `name` (e.g. 'prometheus') from the installed package, else from the checkout."""
    package = Path(__file__).resolve().parent
    for candidate in (package / PACKAGED_DIR / name, package.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise QuantloadError(
        f"quantload's {name}/ files are missing from this installation",
        "reinstall quantload from its repository (pip install .), or run it from a source checkout",
    )
