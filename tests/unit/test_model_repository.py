"""The committed model configs parse with Triton's own schema and keep the tensor contract."""

import re

import pytest
from tritonclient.grpc import model_config_pb2

from tests.support.paths import REPOSITORY as REPO, ROOT
from tts_serving.errors import ModelConfigError
from tts_serving.model_config import (
    defaults,
    parse_settings,
    pbtxt_parameters,
    read_model_config,
)
from tts_serving.settings import SETTINGS, AcousticSettings, knob_table

MODELS = ["phonemizer", "acoustic", "vocoder", "tts", "tts_stream"]


def load(name: str, profile: str | None = None) -> model_config_pb2.ModelConfig:
    path = REPO / name / (f"configs/{profile}.pbtxt" if profile else "config.pbtxt")
    return read_model_config(path)


def settings(name: str):
    return parse_settings(SETTINGS[name], pbtxt_parameters(REPO / name / "config.pbtxt"), name)


@pytest.mark.parametrize("name", MODELS)
def test_config_parses_and_is_named_after_its_folder(name):
    assert load(name).name == name


@pytest.mark.parametrize("name", MODELS)
def test_config_lists_every_parameter_at_its_one_default(name):
    # Defaults live in tts_serving/settings.py; each config shows all of them, unchanged.
    assert pbtxt_parameters(REPO / name / "config.pbtxt") == defaults(SETTINGS[name])
    settings(name)  # and they parse, range checks included


def test_values_that_must_agree_across_models_do():
    ids = {m: settings(m).max_phoneme_ids for m in ("phonemizer", "acoustic", "tts_stream")}
    assert len(set(ids.values())) == 1, ids
    assert settings("tts").sample_rate == settings("vocoder").sample_rate
    # What the clients read to stream at once is what the phonemizer enforces.
    assert settings("tts").max_characters == settings("phonemizer").max_characters
    assert settings("tts_stream").chunk_target_ids <= ids["tts_stream"]
    stages = {m: load(m).max_batch_size for m in ("phonemizer", "acoustic", "vocoder")}
    assert len(set(stages.values())) == 1, stages
    assert load("tts").max_batch_size <= min(stages.values())


def test_the_knob_table_is_generated_from_the_settings():
    docs = (ROOT / "docs/configuration.md").read_text()
    assert knob_table() in docs, "regenerate it: python -m tts_serving.settings"


def test_unknown_and_bad_parameters_are_refused_by_name():
    with pytest.raises(ModelConfigError, match="unknown parameter.*max_phonem_ids"):
        parse_settings(AcousticSettings, {"max_phonem_ids": "400"}, "acoustic")
    with pytest.raises(ModelConfigError, match="intra_op_threads='two' is not a valid int"):
        parse_settings(AcousticSettings, {"intra_op_threads": "two"})
    with pytest.raises(ModelConfigError, match="allow_spinning='maybe' is not a valid bool"):
        parse_settings(AcousticSettings, {"allow_spinning": "maybe"})
    with pytest.raises(ModelConfigError, match="graph_optimization must be one of"):
        parse_settings(AcousticSettings, {"graph_optimization": "max"})
    with pytest.raises(ModelConfigError, match="device must be auto, cpu or cuda"):
        parse_settings(AcousticSettings, {"device": "tpu"})


@pytest.mark.parametrize(
    "raw, value", [("true", True), ("1", True), ("False", False), ("0", False)]
)
def test_booleans_are_read_one_way_everywhere(raw, value):
    assert parse_settings(SETTINGS["phonemizer"], {"normalize_text": raw}).normalize_text is value
    assert parse_settings(SETTINGS["tts_stream"], {"normalize_text": raw}).normalize_text is value


def test_ensemble_tensor_names_are_identical_end_to_end():
    tts = load("tts")
    assert tts.platform == "ensemble"
    steps = tts.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["phonemizer", "acoustic", "vocoder"]
    for step in steps:
        for key, value in list(step.input_map.items()) + list(step.output_map.items()):
            assert key == value, f"{step.model_name}: {key} -> {value}"
        model = load(step.model_name)
        assert set(step.input_map) <= {i.name for i in model.input}
        assert set(step.output_map) <= {o.name for o in model.output}
        assert tts.max_batch_size <= model.max_batch_size


def test_tts_contract():
    tts = load("tts")
    inputs = {i.name: i for i in tts.input}
    assert inputs["text"].data_type == model_config_pb2.TYPE_STRING
    assert list(inputs["text"].dims) == [1]
    assert inputs["speed"].data_type == model_config_pb2.TYPE_FP32 and inputs["speed"].optional
    audio, words, marks = tts.output
    assert (audio.name, audio.data_type, list(audio.dims)) == (
        "audio",
        model_config_pb2.TYPE_FP32,
        [-1],
    )
    assert (words.name, words.data_type, list(words.dims)) == (
        "words",
        model_config_pb2.TYPE_FP32,
        [-1, 4],
    )
    assert (marks.name, marks.data_type, list(marks.dims)) == (
        "marks",
        model_config_pb2.TYPE_FP32,
        [-1, 2],
    )
    assert tts.parameters["sample_rate"].string_value == "22050"


@pytest.mark.parametrize("name", ["acoustic", "vocoder"])
def test_batched_stages_batch_ragged_inputs(name):
    config = load(name)
    assert config.max_batch_size >= 16
    assert list(config.dynamic_batching.preferred_batch_size)
    # 0: a lone request runs at once; batches form from what queues while the instance works.
    assert 0 <= config.dynamic_batching.max_queue_delay_microseconds <= 10_000
    # Scheduling levels: the stage keeps its own queue and limit, and Triton prefetches (a
    # queue policy or priority levels would turn that off: 500 ms stalls in Triton 2.51).
    settings = parse_settings(SETTINGS[name], pbtxt_parameters(REPO / name / "config.pbtxt"))
    assert settings.levels and settings.max_queue_size > 0
    assert not config.dynamic_batching.HasField("default_queue_policy")
    assert config.dynamic_batching.priority_levels == 0
    ragged = [i for i in config.input if -1 in i.dims]
    assert ragged and all(i.allow_ragged_batch for i in ragged)


def test_the_front_door_passes_on_two_full_batches_of_the_profiles_batched_stages():
    """Fewer than one batch in flight starves the batcher; two keep one computed while the
    next forms, and the rate admission refuses by is measured from one batch in flight. A
    GPU profile's batches are larger: the launcher gives the front door its own."""
    from tts_front.settings import FrontSettings
    from tts_launcher.served import BATCHED, front_slots

    batch = max(load(name).max_batch_size for name in BATCHED)
    assert front_slots(None) == 2 * batch
    assert FrontSettings.slots == front_slots(None)  # the front door run alone: the default's
    for profile in ("cpu-int8", "cpu-interactive", "torch-cpu", "gpu", "gpu-dlpack"):
        has = [n for n in BATCHED if (REPO / n / "configs" / f"{profile}.pbtxt").exists()]
        profiled = max(load(n, profile if n in has else None).max_batch_size for n in BATCHED)
        assert front_slots(profile) == 2 * profiled, profile
    assert front_slots("gpu") > front_slots(None)  # the GPU's batches are larger


def test_the_front_doors_slots_follow_the_served_repositorys_batches(tmp_path):
    """A repository whose batched stages batch 4 gets 8 slots: read from the configs Triton
    loads, not a constant."""
    from tts_launcher.served import BATCHED, front_slots

    for name in BATCHED:
        (tmp_path / name / "configs").mkdir(parents=True)
        text = (REPO / name / "config.pbtxt").read_text()
        (tmp_path / name / "config.pbtxt").write_text(
            re.sub(r"max_batch_size: \d+", "max_batch_size: 4", text)
        )
        gpu = (REPO / name / "configs" / "gpu.pbtxt").read_text()
        (tmp_path / name / "configs" / "gpu.pbtxt").write_text(gpu)
    assert front_slots(None, tmp_path) == 8
    assert front_slots("gpu", tmp_path) == front_slots("gpu")
    assert front_slots("no-such-profile", tmp_path) == 8  # Triton's fallback: config.pbtxt


def test_tts_stream_is_decoupled_and_speaks_the_tts_contract():
    stream, tts = load("tts_stream"), load("tts")
    assert stream.model_transaction_policy.decoupled
    assert {i.name: i.data_type for i in stream.input} == {i.name: i.data_type for i in tts.input}
    outputs = {o.name: (o.data_type, list(o.dims)) for o in tts.output}
    assert {
        o.name: (o.data_type, list(o.dims)) for o in stream.output if o.name != "chunk_text"
    } == {k: v for k, v in outputs.items() if k != "audio"} | {"audio": (outputs["audio"][0], [-1])}
    assert {i.name for i in tts.input if i.optional} == {
        "speed",
        "noise_scale",
        "noise_w",
        "normalize",
        "voice",
        "word_timestamps",
        "speaker",
    }
    assert "audio" in {o.name for o in stream.output}


def test_every_stage_takes_the_voice_and_the_ensemble_passes_it_on():
    for name in ("phonemizer", "acoustic", "vocoder", "tts_stream", "tts"):
        (voice,) = [i for i in load(name).input if i.name == "voice"]
        assert voice.optional and list(voice.dims) == [1], name
    steps = load("tts").ensemble_scheduling.step
    assert [dict(s.input_map).get("voice") for s in steps] == ["voice"] * 3


STAGE_CONFIGS = [
    p
    for name in ("phonemizer", "acoustic", "vocoder")
    for p in [REPO / name / "config.pbtxt", *sorted(REPO.glob(f"{name}/configs/*.pbtxt"))]
]


@pytest.mark.parametrize("path", STAGE_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_stages_that_batch_in_triton_have_the_client_levels_and_the_others_prefetch(path):
    """A stage scheduled in batches takes interactive requests first by Triton's priority
    levels, and refuses past its limit by Triton's queue policy. Everywhere else neither:
    either turns off Triton's prefetching (the phonemizer, a stage scheduling by levels)."""
    from tts_client.protocol import PRIORITY_LEVELS

    name = path.parts[-3] if path.parent.name == "configs" else path.parts[-2]
    batching = read_model_config(path).dynamic_batching
    settings = None
    if name != "phonemizer":
        settings = parse_settings(SETTINGS[name], pbtxt_parameters(path), name)
    if settings is not None and not settings.levels:
        assert batching.priority_levels == PRIORITY_LEVELS
        assert batching.default_priority_level == PRIORITY_LEVELS  # bulk by default
        assert batching.default_queue_policy.max_queue_size == settings.max_queue_size
    else:
        assert batching.priority_levels == 0
        assert not batching.HasField("default_queue_policy")


PROFILE_FILES = sorted(REPO.glob("*/configs/*.pbtxt"))


def test_profiles_are_generated_and_up_to_date():
    from tts_launcher.profiles import PROFILES, expected

    generated = sorted(p for p in expected() if p.parent.name == "configs")
    assert generated == PROFILE_FILES, "run python -m tts_launcher.profiles"
    # Each model's config.pbtxt too: its input and output blocks are tts_wire.tensors'.
    assert {p.parent.name for p in expected() if p.name == "config.pbtxt"} == set(MODELS)
    for path, text in expected().items():
        assert path.read_text() == text, f"{path} is stale: run python -m tts_launcher.profiles"
    assert {"gpu", "torch-cpu"} <= set(PROFILES)


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: f"{p.parts[-3]}/{p.stem}")
def test_a_profile_keeps_the_model_contract_and_valid_parameters(path):
    """Same name, tensors and batching flags as config.pbtxt; parameters parse and validate."""
    name = path.parts[-3]
    profile, base = read_model_config(path), load(name)
    assert profile.name == base.name and profile.backend == base.backend
    assert profile.input == base.input and profile.output == base.output
    settings = parse_settings(SETTINGS[name], pbtxt_parameters(path), name)
    if path.stem == "gpu" and name in ("acoustic", "vocoder"):
        assert settings.engine == "torch" and settings.device == "cuda"
        assert profile.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        assert settings.graph_batches[-1] <= profile.max_batch_size
    if path.stem == "torch-cpu":
        assert settings.engine == "torch" and settings.device == "cpu"
    if getattr(settings, "engine", None) == "torch":  # `make serve PROFILE=...` installs torch
        makefile = (REPO.parent / "Makefile").read_text()
        torch_profiles = re.search(r"^TORCH_PROFILES := (.*)$", makefile, re.M).group(1).split()
        assert path.stem in torch_profiles, path


def test_model_adapters_import_the_wire_contract_not_the_client():
    """model.py files are outside import-linter's packages: the same rule, read from their AST."""
    import ast

    above = {
        "tts_client", "tts_gateway", "tts_front", "tts_launcher", "tts_tools", "export", "bench",
    }  # fmt: skip
    for path in sorted(REPO.glob("*/1/model.py")):
        tree = ast.parse(path.read_text())
        names = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            node.module.split(".")[0] for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }  # fmt: skip
        assert not names & above, f"{path} imports {sorted(names & above)}"


def test_one_version_everywhere_and_in_the_changelog():
    """Written once, in tts_wire: both distributions read it (setuptools' attr), the server,
    the gateway and Wyoming report it, and the changelog's newest entry names it."""
    import re

    import tomllib

    import tts_serving
    import tts_wire
    from tts_gateway import wyoming
    from tts_gateway.app import create_app
    from tts_gateway.settings import GatewaySettings

    for path, attr in (
        ("pyproject.toml", "wire.tts_wire.__version__"),
        ("client/pyproject.toml", "tts_wire.__version__"),
    ):
        project = tomllib.loads((ROOT / path).read_text())
        assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
        assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": attr}
    reported = {tts_serving.__version__, create_app(GatewaySettings()).version, wyoming.VERSION}
    assert reported == {tts_wire.__version__}
    latest = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    assert latest == tts_wire.__version__


def test_the_license_is_mit_and_notice_names_every_copyleft_dependency():
    """LICENSE is the MIT text the packages declare; NOTICE names each package the server
    installs (requirements/serve.txt) whose installed metadata says GPL or LGPL, with that
    license: zeroconf (LGPL, the gateway's mDNS) was missing from it."""
    from importlib.metadata import distribution

    import tomllib

    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    assert "Permission is hereby granted, free of charge" in license_text
    for path in ("pyproject.toml", "client/pyproject.toml"):
        assert tomllib.loads((ROOT / path).read_text())["project"]["license"] == "MIT", path
    notice = (ROOT / "NOTICE").read_text()
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==", (ROOT / "requirements/serve.txt").read_text(), re.M)
    copyleft = []
    for name in pins:
        metadata = distribution(name).metadata
        # The license's name: the expression, the classifiers, a short License field (a long
        # one is a whole text: numpy's quotes the licenses of what its wheels bundle).
        field = metadata.get("License") or ""
        said = " ".join([metadata.get("License-Expression") or "", field[:100]])
        said += " ".join(metadata.get_all("Classifier") or [])
        if re.search(r"\bL?GPL|General Public License", said):
            copyleft.append(name)
            assert re.search(rf"\b{re.escape(name)}\b[^\n]*\n?[^\n]*L?GPL", notice), name
    assert "piper-tts" in copyleft  # the check reads what it should
