"""docs/adding-a-feed.md's blocks, and its new pipeline written from them as a package, in either form."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from medallion_assets_tests.support.paths import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "adding-a-feed.md"


def blocks(language: str) -> list[str]:
    """The page's fenced blocks in ``language``, in the page's order."""
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


def write_page_pipeline(root: Path, package: str, form: str) -> None:
    """The page's blocks as the package ``package`` under ``root``, in the ``python`` or ``yaml`` form."""
    declaration, gold = blocks("python")
    [component] = blocks("yaml")
    folder = root / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    if form == "python":
        (folder / "payments.py").write_text(f"{declaration}\n\n{gold}")
    else:
        (folder / "payments").mkdir()
        (folder / "payments" / "defs.yaml").write_text(component)
        (folder / "payments_gold.py").write_text(gold)


def forget(package: str) -> None:
    """``package`` and its modules out of ``sys.modules``: the next test imports its own files under that name."""
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        del sys.modules[name]
