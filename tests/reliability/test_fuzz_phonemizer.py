"""The long fuzz run of `make test-reliability`: 10 minutes of grammar texts and
mutations of the known crashers through the server's own worker code, not one crasher."""

import pytest

from bench.fuzz_phonemizer import fuzz


@pytest.mark.long
def test_ten_minute_fuzz_run_finds_no_crasher():
    tried, crashers, delayed = fuzz(600, None, 7, False, 1000)
    print(f"\nfuzz: {tried} texts in 600 s, {len(crashers)} crashers, {delayed} delayed crashes")
    assert (crashers, delayed) == ([], 0), [c[:80] for c in crashers[:3]]
