"""Engines: the voice's two halves as batched callables (ONNX Runtime by default, torch for
the GPU profile), the batching helpers they share, and the voice's loudness."""
