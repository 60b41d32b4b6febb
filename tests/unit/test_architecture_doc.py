"""docs/architecture.md's layout of tts_serving names the files the package has, and only
those (the docs had drifted from the code once)."""

from __future__ import annotations

import re

from tests.support.paths import ROOT


def layout_block(package: str, following: str) -> str:
    doc = (ROOT / "docs/architecture.md").read_text()
    layout = doc[doc.index("## Layout of the repository") :]
    return layout[layout.index(f"\n{package}/") : layout.index(f"\n{following}/")]


def test_the_layout_of_tts_serving_matches_the_package():
    block = layout_block("tts_serving", "tts_gateway")
    package = ROOT / "tts_serving"
    modules = {p.relative_to(package) for p in package.rglob("*.py") if p.name != "__init__.py"}
    named = set(re.findall(r"\b(\w+)\.py\b", block)) - {"model"}  # the model.py files
    for module in modules:
        # Every module is named, as name.py or (inside a subpackage's line) as its bare name.
        assert module.stem in named or re.search(rf"\b{module.stem}\b", block), module
        for folder in module.parents[:-1]:
            assert f"{folder}/" in block, folder
    # Nothing is named that is not there.
    assert named <= {m.stem for m in modules}, named - {m.stem for m in modules}
    folders = set(re.findall(r"^ +(\w+)/", block, re.M))
    assert folders == {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
