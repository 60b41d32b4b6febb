"""Engines: the voice's two halves as batched callables (ONNX Runtime by default, torch for
the GPU profile), the batching helpers they share, and the voice's loudness."""

# The torch engine's weights beside each half's model.onnx (written by the export). Named
# here, not in torch_weights.py, so that naming it imports no torch.
WEIGHTS_FILE = "weights.safetensors"
# The vocoder in int8 for ONNX Runtime (dtype int8, profile cpu-int8; export/quantize.py).
INT8_FILE = "model.int8.onnx"
