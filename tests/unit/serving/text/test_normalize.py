import time

import pytest

from tts_front.sample_texts import hostile_texts
from tts_serving.text import cardinal, normalize, ordinal
from tts_serving.text.numbers import year
from tts_wire.split import estimate_ids, split_text


@pytest.mark.parametrize(
    "n, words",
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (99, "ninety-nine"),
        (101, "one hundred one"),
        (1234, "one thousand two hundred thirty-four"),
        (2_000_005, "two million five"),
        (-7, "minus seven"),
    ],
)
def test_cardinal(n, words):
    assert cardinal(n) == words


@pytest.mark.parametrize(
    "n, words",
    [(1, "first"), (2, "second"), (3, "third"), (5, "fifth"), (12, "twelfth"),
     (20, "twentieth"), (21, "twenty-first"), (100, "one hundredth"), (103, "one hundred third")],
)  # fmt: skip
def test_ordinal(n, words):
    assert ordinal(n) == words


@pytest.mark.parametrize(
    "n, words",
    [(1999, "nineteen ninety-nine"), (2005, "two thousand five"), (2024, "twenty twenty-four"),
     (1900, "nineteen hundred"), (1905, "nineteen oh five")],
)  # fmt: skip
def test_year(n, words):
    assert year(n) == words


CASES = [
    # currency
    ("It costs $5.50.", "It costs five dollars and fifty cents."),
    ("$1 and $0.99", "one dollar and ninety-nine cents"),
    ("EUR 3 or €12", "three euros or twelve euros"),
    ("£2.01", "two pounds and one penny"),
    ("$2.5 million", "two point five million dollars"),
    ("$1,200", "one thousand two hundred dollars"),
    # numbers, decimals, percentages, ordinals
    ("We had 1,234 users.", "We had one thousand two hundred thirty-four users."),
    ("Pi is 3.14", "Pi is three point one four"),
    ("Up 45% or 3.5 %", "Up forty-five percent or three point five percent"),
    ("the 1st, 2nd and 23rd", "the first, second and twenty-third"),
    ("It was -5 outside", "It was minus five outside"),
    # dates, times, years
    ("on 3/15/2024", "on March fifteenth, twenty twenty-four"),
    ("on 2024-03-15", "on March fifteenth, twenty twenty-four"),
    ("March 15, 2024", "March fifteenth, twenty twenty-four"),
    ("Jan 3rd", "January third"),
    ("at 3:30 pm", "at three thirty p m"),
    ("at 10:05", "at ten oh five"),
    ("at 12:00", "at twelve o'clock"),
    ("in 1999", "in nineteen ninety-nine"),
    # abbreviations
    ("Dr. Smith and Mr. Brown", "Doctor Smith and Mister Brown"),
    ("St. Louis is on Main St. today", "Saint Louis is on Main Street today"),
    ("cats, dogs, etc. vs. birds", "cats, dogs, et cetera versus birds"),
    ("No. 5", "number five"),
    # units
    ("5 km in 30 min", "five kilometers in thirty minutes"),
    ("1 kg and 2 GB", "one kilogram and two gigabytes"),
    ("20°C", "twenty degrees Celsius"),
    ("60 mph", "sixty miles per hour"),
    # URLs and e-mail
    ("see https://www.example.com/docs.", "see www dot example dot com slash docs."),
    ("mail jane.doe@example.org", "mail jane dot doe at example dot org"),
    # symbols, emoji, control characters
    ("salt & pepper + 2", "salt and pepper plus two"),
    ("fun 🎸🔥 times", "fun times"),
    ("tab\there\x07bell", "tab here bell"),
    # a.m./p.m. that also end a sentence keep the sentence end
    ("at 10:05 am. The company's", "at ten oh five a m. The company's"),
    ("at 3:30 p.m. today", "at three thirty p m today"),
    ("open 9 am to 5 pm", "open nine a m to five p m"),
    # decades are not seconds
    ("the 1990s", "the nineteen nineties"),
    ("the '80s and 1800s", "the eighties and eighteen hundreds"),
    # phone numbers are read as digit groups
    ("call 555-123-4567", "call five five five, one two three, four five six seven"),
    ("(555) 123-4567", "five five five, one two three, four five six seven"),
    ("+1 555.123.4567", "one, five five five, one two three, four five six seven"),
    # fractions
    ("1/2 cup", "one half cup"),
    ("3/4 of it", "three quarters of it"),
    ("2 1/3 more", "two and one third more"),
    ("5/8 inch", "five eighths inch"),
    ("open 24/7", "open twenty-four seven"),
    # versions and addresses are not decimals followed by a sentence end
    ("version 2.0.1.", "version two point zero point one."),
    ("v1.10.3 is out", "version one point ten point three is out"),
    (
        "ping 192.168.0.1 now",
        "ping one hundred ninety-two dot one hundred sixty-eight dot zero dot one now",
    ),
    # numbers past the spelled-out range are read digit by digit, never an exception
    (
        "id 12345678901234567890",
        "id " + " ".join("one two three four five six seven eight nine zero".split() * 2),
    ),
]


@pytest.mark.parametrize("text, spoken", CASES)
def test_normalize(text, spoken):
    assert normalize(text) == spoken


@pytest.mark.parametrize("text, _", CASES)
def test_normalize_leaves_no_digits_and_is_idempotent(text, _):
    once = normalize(text)
    assert not any(c.isdigit() for c in once)
    assert normalize(once) == once


@pytest.mark.parametrize("text", ["9" * 5000, "1," * 3000 + "1", "12.34.56.78.90." * 200])
def test_huge_numbers_never_raise(text):
    spoken = normalize(text)
    assert spoken and not any(c.isdigit() for c in spoken)


def test_normalize_keeps_every_word():
    text = "Hello 👋 world, this is 😀 fine."
    assert normalize(text) == "Hello world, this is fine."


def test_split_keeps_every_word_in_order_and_respects_the_limit():
    text = " ".join(
        f"Sentence number {cardinal(i)} talks about something, and then it goes on for a while."
        for i in range(40)
    )
    chunks = split_text(text, max_len=200)
    assert " ".join(c.text for c in chunks).split() == text.split()
    assert all(estimate_ids(c.text) <= 200 for c in chunks)
    assert chunks[-1].sentence_end


def test_split_goes_to_clauses_then_words():
    long_clauses = ", ".join(["this clause is fairly long indeed"] * 12) + "."
    chunks = split_text(long_clauses, max_len=120)
    assert len(chunks) > 1
    assert all(c.text.endswith(",") for c in chunks[:-1])  # cut at clause boundaries
    assert [c.sentence_end for c in chunks] == [False] * (len(chunks) - 1) + [True]
    no_punctuation = " ".join(["word"] * 200)
    chunks = split_text(no_punctuation, max_len=60)
    assert all(estimate_ids(c.text) <= 60 for c in chunks)
    assert sum(len(c.text.split()) for c in chunks) == 200


def test_split_packs_short_sentences_and_keeps_the_first_chunk_short():
    text = "Hi. " * 30
    chunks = split_text(text, max_len=400, target_len=200, first_len=20)
    assert estimate_ids(chunks[0].text) <= 20
    assert all(estimate_ids(c.text) <= 200 for c in chunks)
    assert len(chunks) < 10  # packed, not thirty tiny chunks


def test_a_long_first_sentence_is_not_cut_for_fast_first_audio():
    """Only the packing of the first chunk is capped: a sentence in two pieces is heard as two
    utterances (the server decodes the first audio early instead)."""
    first = "The first sentence is rather long, and it has a clause, and another one here."
    chunks = split_text(f"{first} Next. And more.", max_len=400, first_len=60)
    assert [(c.text, c.sentence_end) for c in chunks] == [(first, True), ("Next. And more.", True)]


@pytest.mark.parametrize("word", ["a" * 500, "A.B.C.D.E.F.G." * 20, "x" * 100_000, "ab-cd/" * 300])
def test_a_word_longer_than_the_limit_is_cut_into_pieces_that_fit(word):
    chunks = split_text(f"Before {word} after.", max_len=100)
    assert all(estimate_ids(c.text) <= 100 for c in chunks)
    assert "".join(" ".join(c.text for c in chunks).split()) == f"Before{word}after."
    if "." in word:  # dotted letters are cut after a dot, never inside a letter pair
        inner = [c.text for c in chunks if "." in c.text]
        assert all(t.endswith(".") for t in inner[:-1])


def test_split_handles_empty():
    assert split_text("   ", max_len=100) == []


@pytest.mark.parametrize("name, text", list(hostile_texts(100_000).items()))
def test_normalization_is_linear_on_hostile_shapes(name, text):
    # Linear shapes take under 1.5 s here; the quadratic ones this replaced took 30 to 78 s.
    # The bound is generous so a busy machine cannot fail it (bench.text_cost measured it once:
    # docs/history/2026-12-04-one-off-benchmarks.md).
    start = time.perf_counter()
    spoken = normalize(text)
    assert time.perf_counter() - start < 20, name
    assert not any(c.isdigit() for c in spoken)
