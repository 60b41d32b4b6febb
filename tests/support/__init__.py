"""What the tests share: paths, fakes, launchers, probes, helpers (no tests here)."""
