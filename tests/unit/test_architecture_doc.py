"""docs/architecture.md's layout of the server, the gateway and the tools names the modules each
package has, and only those (the docs had drifted from the code twice: a launcher module
named after it was gone)."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import ROOT


def layout_block(package: str, following: str) -> str:
    doc = (ROOT / "docs/architecture.md").read_text()
    layout = doc[doc.index("## Layout of the repository") :]
    return layout[layout.index(f"\n{package}/") : layout.index(f"\n{following}/")]


@pytest.mark.parametrize(
    "package, following",
    [
        ("tts_serving", "tts_gateway"),
        ("tts_gateway", "tts_launcher"),
        ("tts_launcher", "tts_front"),
        ("tts_front", "tts_triton"),
        ("tts_triton", "tts_tools"),
        ("tts_tools", "export"),
    ],
)
def test_the_layout_names_every_module_of_the_package_and_no_other(package, following):
    block = layout_block(package, following)
    root = ROOT / package
    modules = {
        p.relative_to(root)
        for p in [*root.rglob("*.py"), *root.rglob("*.c")]
        if p.name not in ("__init__.py", "__main__.py")
    }
    named = set(re.findall(r"\b(\w+)\.(?:py|c)\b", block)) - {"model"}  # the model.py files
    for module in modules:
        # Every module is named, as name.py or (inside a subpackage's line) as its bare name.
        assert module.stem in named or re.search(rf"\b{module.stem}\b", block), module
        for folder in module.parents[:-1]:
            assert f"{folder}/" in block, folder
    # Nothing is named that is not there.
    assert named <= {m.stem for m in modules}, named - {m.stem for m in modules}
    folders = set(re.findall(r"^ +(\w+)/", block, re.M))
    assert folders == {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
