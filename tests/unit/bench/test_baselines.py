"""bench.baselines: the benchmarks' baselines in a repository of their own, never served."""

from __future__ import annotations

from bench.baselines import BASELINES, baseline_repository, configs
from tts_launcher.profiles import PROFILES
from tts_launcher.served import REPOSITORY, profiles
from tts_serving.model_config import pbtxt_parameters


def test_the_served_repository_holds_served_profiles_only():
    assert set(profiles(REPOSITORY)) == set(PROFILES)
    assert not set(BASELINES) & set(PROFILES)


def test_a_baseline_repository_links_the_served_models_and_adds_the_baselines(tmp_path):
    made = baseline_repository(tmp_path / "b")
    assert set(profiles(made)) == set(PROFILES) | set(BASELINES)
    vocoder = made / "vocoder"
    assert (vocoder / "1").resolve() == (REPOSITORY / "vocoder" / "1").resolve()
    served = (REPOSITORY / "vocoder" / "config.pbtxt").read_text()
    assert (vocoder / "config.pbtxt").read_text() == served
    # Each baseline is the served config.pbtxt with its override alone.
    base = pbtxt_parameters(REPOSITORY / "vocoder" / "config.pbtxt")
    padded = pbtxt_parameters(vocoder / "configs" / "cpu-padded.pbtxt")
    assert {k: v for k, v in padded.items() if base.get(k) != v} == {"items_side_by_side": "false"}
    # Made again from scratch: a config removed from the served repository goes from it too.
    (vocoder / "configs" / "stale.pbtxt").write_text("")
    assert not (baseline_repository(tmp_path / "b") / "vocoder/configs/stale.pbtxt").exists()


def test_nothing_is_written_into_the_served_repository(tmp_path):
    assert all(path.is_relative_to(tmp_path) for path in configs(tmp_path))


def test_the_gpu_docs_table_lists_every_served_profile():
    import re

    from tests.support.paths import ROOT

    section = (ROOT / "docs" / "gpu.md").read_text().split("## Profiles", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w-]+)` \|", section, re.M)
    assert sorted(rows) == sorted(profiles(REPOSITORY))
