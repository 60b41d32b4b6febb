import logging

from tts_wire.refusals import KINDS, OTHER, RefusalFilter, Refusals


def test_one_line_a_kind_an_interval_and_the_next_says_how_many_were_not_logged(caplog):
    clock = [100.0]
    refusals = Refusals(logging.getLogger("test.refusals"), interval_s=60, clock=lambda: clock[0])
    with caplog.at_level(logging.INFO, "test.refusals"):
        assert refusals.refused("a bad header", "from 10.0.0.1")
        assert not any(refusals.refused("a bad header") for _ in range(279))
        assert refusals.refused("another kind")
        clock[0] += 61
        assert refusals.refused("a bad header")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("refused: a bad header: from 10.0.0.1;")
    assert "279 more since the last such line" in lines[2]
    assert all(r.exc_info is None for r in caplog.records)


def test_kinds_past_the_cap_count_as_one(caplog):
    refusals = Refusals(logging.getLogger("test.refusals.cap"))
    with caplog.at_level(logging.INFO, "test.refusals.cap"):
        for i in range(KINDS + 50):
            refusals.refused(f"kind {i}\nwith a second line")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == KINDS + 1 and OTHER in lines[-1]
    assert all("second line" not in line for line in lines)


def test_a_librarys_refusal_with_its_traceback_becomes_a_counted_line(caplog):
    library = logging.getLogger("test.library")
    ours = logging.getLogger("test.ours")
    library.addFilter(
        RefusalFilter(Refusals(ours), lambda r: "bad" if "refused" in r.getMessage() else None)
    )
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            try:
                raise ValueError("the client's bytes")
            except ValueError:
                library.exception("request refused")
        library.warning("something else")
    assert [(r.name, r.getMessage()[:12]) for r in caplog.records] == [
        ("test.ours", "refused: bad"), ("test.library", "something el")
    ]  # fmt: skip
