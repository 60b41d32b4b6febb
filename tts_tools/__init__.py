"""Operator and developer tools around the model repository (not imported by any model.py).

``server``: the launcher of the tritonserver binary (``make serve``, tests, benchmarks);
``statistics``: Triton's per-model statistics as typed values; ``texts``: the sentences and
paragraph the tests and benchmarks share.
"""
