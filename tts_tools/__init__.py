"""Developer tools (nothing the server or its image runs): ``cpu_scaling``: the instances and
threads per stage for a CPU of N cores; ``gpu_bundle``:
an offline folder that serves and benchmarks the GPU profile on a CUDA machine.
"""
