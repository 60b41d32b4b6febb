"""tts_triton.workarounds is the one list of what exists for the Triton release we embed: each
place it names is there, and each product module that mentions the release is in it."""

from __future__ import annotations

import ast
import re

from tests.support.paths import ROOT
from tts_triton.workarounds import RELEASE, WORKAROUNDS

PRODUCT = (
    "tts_front", "tts_launcher", "tts_serving", "tts_gateway", "tts_tools", "client/tts_client",
)  # fmt: skip


def source_of(module: str):
    parts = module.split(".")
    base = ROOT / "client" if parts[0] == "tts_client" else ROOT
    return base.joinpath(*parts).with_suffix(".py")


def resolve(place: str) -> None:
    """The file, or the module's definition or assignment of each dotted part (read, not
    imported: the model stages need pb_utils)."""
    if ":" not in place:
        assert (ROOT / place).is_file(), place
        return
    module, attribute = place.split(":")
    path = source_of(module)
    assert path.is_file(), place
    scope = ast.parse(path.read_text()).body
    for part in attribute.split("."):
        found = [
            node for node in scope
            if (isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name == part)
            or (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == part for t in node.targets))
        ]  # fmt: skip
        assert found, place
        scope = getattr(found[0], "body", [])


def test_every_place_named_exists_and_each_has_its_condition_and_proof():
    for workaround in WORKAROUNDS:
        assert workaround.where and workaround.remove_when, workaround.name
        assert (ROOT / workaround.proof).is_file(), workaround.proof
        for place in workaround.where:
            resolve(place)


def module_of(path) -> str:
    relative = path.relative_to(ROOT / "client" if path.is_relative_to(ROOT / "client") else ROOT)
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_that_mentions_the_release_is_listed():
    mention = re.compile(rf"Triton {re.escape(RELEASE)}|{re.escape(RELEASE)} (aborts|Python)")
    listed = {place.split(":")[0] for w in WORKAROUNDS for place in w.where}
    unlisted = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")) + sorted((ROOT / package).rglob("*.c")):
            name = str(path.relative_to(ROOT)) if path.suffix == ".c" else module_of(path)
            # A package's docstring may say what its listed modules do for the release.
            in_list = name in listed or any(m.startswith(f"{name}.") for m in listed)
            if mention.search(path.read_text()) and not in_list:
                unlisted.append(name)
    assert not unlisted, f"mention Triton {RELEASE} but are not in tts_triton.workarounds"
