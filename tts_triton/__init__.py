"""The embedded tritonserver as the other packages see it: ``probes`` (health, stub
processes) and ``workarounds`` (what each part does for Triton 2.51, and when it can go)."""
