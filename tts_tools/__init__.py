"""Developer tools (nothing the server or its image runs): ``cpu_scaling``: the instances and
threads per stage for a CPU of N cores; ``gpu_bundle``, ``gpu_lease`` (and ``gpu_lease.sh``):
what a lent GPU machine is prepared with.
"""
