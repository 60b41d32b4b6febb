"""bench/ holds the benchmarks that are kept: each in docs/performance.md's table of
benchmarks and each with a test of what it computes."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

HELPERS = ("__init__", "machine", "baselines")  # no figures of their own


def test_every_benchmark_has_a_row_in_the_docs_and_a_test():
    table = (ROOT / "docs" / "performance.md").read_text().split("### The benchmarks", 1)[1]
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    for path in sorted((ROOT / "bench").glob("*.py")):
        name = path.stem
        if name in HELPERS:
            continue
        assert f"`bench.{name}`" in table, f"bench.{name} has no row in performance.md's table"
        imported = rf"from bench(\.{name} import| import [\w, ]*\b{name}\b)|import bench\.{name}\b"
        assert re.search(imported, tests), f"no test imports bench.{name}"
