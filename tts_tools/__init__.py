"""Operator and developer tools around the model repository (not imported by any model.py).

``healthcheck``: the container's and the Deployment's probe; ``statistics``: Triton's
per-model statistics as typed values (tests and benchmarks read them); ``cpu_scaling``: the
instances and threads per stage for a CPU of N cores; ``gpu_bundle``, ``gpu_lease`` (and
``gpu_lease.sh``): what a lent GPU machine is prepared with.
"""
