"""bench.wyoming's summary: medians over rounds and the ratio per round, side by side."""

from __future__ import annotations

from bench.wyoming import Burst, summary


def burst(p90_s: float, throughput: float) -> Burst:
    # Ten requests whose 90th percentile of first audio is p90_s; 10 s of audio.
    return Burst([p90_s] * 10, [0.5] * 10, audio_s=10.0, wall_s=10.0 / throughput)


def test_the_summary_gives_medians_and_the_ratio_of_each_round_with_its_range():
    rows = {
        ("synthesize", 16): {
            "ours-cut": [burst(0.5, 36.0), burst(0.6, 30.0), burst(0.4, 33.0)],
            "ours-windows": [burst(1.0, 30.0), burst(1.0, 30.0), burst(1.0, 30.0)],
            "wyoming-piper": [burst(2.0, 30.0), burst(2.0, 20.0), burst(1.0, 30.0)],
        }
    }
    header, rule, cut, windows = summary(rows, "wyoming-piper")
    assert "wyoming-piper p90 ms" in header and "wyoming-piper audio-s/s" in header
    assert rule.count("|") == header.count("|") == cut.count("|")
    cells = [c.strip() for c in cut.strip("|").split("|")]
    assert cells[:6] == ["synthesize", "16", "ours-cut", "3", "500", "2000"]
    # p90 ratios per round 0.25, 0.30, 0.40; throughput 1.2, 1.5, 1.1: not ratios of medians.
    assert cells[6] == "0.30x [0.25-0.40]"
    assert cells[7:9] == ["33.0", "30.0"]
    assert cells[9] == "1.20x [1.10-1.50]"
    cells = [c.strip() for c in windows.strip("|").split("|")]
    assert cells[2] == "ours-windows" and cells[6] == "0.50x [0.50-1.00]"
