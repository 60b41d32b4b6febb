"""docs/admission.md's table of every limit, generated from the code (tts_launcher/limits.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tts_launcher.limits import DOC, LIMITS, documented, main, table

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("tts_front", "tts_gateway", "tts_launcher", "tts_serving", "wire/tts_wire")


def test_the_documented_table_is_the_generated_one():
    assert documented(DOC.read_text()) == table()
    assert main(["--check"]) == 0


def test_every_per_client_cap_in_the_code_is_in_the_table():
    """A new PerClient anywhere in the product must get a row (its module as "kept by")."""
    kept_by = {limit.where for limit in LIMITS}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if re.search(r"\bPerClient\(", path.read_text()) and path.name != "caps.py":
                where = path.relative_to(ROOT).as_posix()
                assert where in kept_by, f"{where} keeps a per-client cap the table lacks"


def test_a_default_read_from_the_code_reaches_the_table(monkeypatch):
    import dataclasses

    from tts_launcher import limits

    row = next(r for r in table().splitlines() if "ModelStreamInfer" in r)
    assert "| 256 |" in row
    real = limits.FrontSettings

    def other(**kw):
        return dataclasses.replace(real(**kw), max_grpc_streams_per_client=7)

    monkeypatch.setattr(limits, "FrontSettings", other)
    row = next(r for r in table().splitlines() if "ModelStreamInfer" in r)
    assert "| 7 |" in row
