"""Where the checkout's files are, for tests that read the docs or run commands at its root."""

from pathlib import Path

#: The checkout's root (pyproject.toml, docs/, the packages).
REPO_ROOT = Path(__file__).resolve().parents[2]
