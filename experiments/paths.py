"""Where experiments read and write: the committed results and report, and the run cache (git-ignored)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
REPORT = ROOT / "REPORT.md"
# Per-run outputs and pretrained tiny-LM weights; `.cache/` is git-ignored. Override for CI sandboxes.
CACHE = Path(os.environ.get("TGC_EXPERIMENTS_CACHE", ROOT / ".cache"))
