"""Where the project's files are, for every test."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
REPOSITORY = ROOT / "model_repository"
