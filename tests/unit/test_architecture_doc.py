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
    named = set(re.findall(r"\b(\w+\.(?:py|c))\b", block)) - {"model.py"}  # model.py files
    files = {module.name for module in modules}
    for module in modules:
        # Every module is named by its file name (a bare word would also match prose: "the
        # settings" named settings.py before), each subpackage by its folder.
        assert module.name in named, module
        for folder in module.parents[:-1]:
            assert f"{folder}/" in block, folder
    # Nothing is named that is not there.
    assert named <= files, named - files
    folders = set(re.findall(r"^ +(\w+)/", block, re.M))
    assert folders == {p.name for p in root.iterdir() if (p / "__init__.py").exists()}


def test_no_doc_names_an_issue_of_ours_readers_cannot_see():
    """Issue numbers are this team's tracker's, which a reader of the project does not have:
    a doc says what holds and why (history goes to commits and docs/decisions/). A number
    of another project's tracker names that project."""
    import re

    from tests.support.paths import ROOT

    docs = [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    upstream = ("pytest-xdist issue", "triton-inference-server issue", "containers/podman issue")
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in docs
        for text in [path.read_text()]
        for m in re.finditer(r"\b[Ii]ssues? \d+", text)
        if not text[: m.end()].rstrip("0123456789 ").endswith(upstream)
    ]
    assert found == [], found


def test_the_diagrams_boxes_close():
    """Each box drawn in docs/architecture.md (a border ``+---+``, sides ``|``, the same
    border below) has its sides in its border's columns on every line: a line written wider
    than its box broke the drawing before."""
    doc = (ROOT / "docs/architecture.md").read_text()
    boxes = 0
    for block in re.findall(r"^```\n(.*?)^```", doc, re.M | re.S):
        lines = block.splitlines()
        opened: dict[tuple[int, int], int] = {}
        for number, line in enumerate(lines):
            for border in re.finditer(r"\+[-+v^]+\+", line):
                span = (border.start(), border.end() - 1)
                if span not in opened:
                    opened[span] = number
                    continue
                top = opened.pop(span)
                boxes += 1
                for inside in lines[top + 1 : number]:
                    sides = [inside[c] if c < len(inside) else " " for c in span]
                    assert sides == ["|", "|"], f"box at columns {span}: {inside!r}"
        assert not opened, f"a box that never closes: {opened}"
    assert boxes >= 4  # the processes' diagram


def test_the_docs_layers_are_the_import_contracts():
    """docs/architecture.md's layers inside each package are the ones `make lint` enforces
    (pyproject.toml's import-linter contracts), in the same order."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    doc = (ROOT / "docs/architecture.md").read_text()
    intro = doc[: doc.index("## Packages, top to bottom")]
    described = {
        m[1]: [layer.strip() for layer in m[2].split(">")]
        for m in re.finditer(r"^- the (\w[\w ]*?): (.*?)(?:[.;]$)", intro, re.M | re.S)
    }
    by_container = {}
    for contract in contracts["contracts"]:
        if contract["type"] == "layers" and contract.get("containers"):
            (container,) = contract["containers"]
            by_container[container] = [f"`{layer}`" for layer in contract["layers"]]
    names = {"server": "tts_serving", "front door": "tts_front", "launcher": "tts_launcher",
             "gateway": "tts_gateway"}  # fmt: skip
    assert set(described) == set(names), described
    for name, layers in described.items():
        layers = [" ".join(layer.split()) for layer in layers]
        layers = [re.sub(r" \(.*?\)", "", layer) for layer in layers]
        assert layers == by_container[names[name]], name
