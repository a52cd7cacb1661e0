"""MkDocs hook: regenerate the reference pages made from the code (docs/generate.py) before every build."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import main as generate  # noqa: E402


def on_pre_build(config, **kwargs):
    """Write docs/reference/{cli,variables,dumps}.md as the code makes them now."""
    generate([])
