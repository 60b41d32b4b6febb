"""The embedded tritonserver as the other packages see it: ``probes`` (health, stub
processes), ``statistics`` (its per-model statistics as typed values with deltas) and
``workarounds`` (what each part does for Triton 2.51, and when it can go)."""
