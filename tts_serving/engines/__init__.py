"""Engines: the voice's two halves as batched callables (ONNX Runtime by default, torch for
the GPU profile), the batching helpers they share, and the voice's loudness."""

# The torch engine's weights beside each half's model.onnx (written by the export). Named
# here, not in torch_weights.py, so that naming it imports no torch.
WEIGHTS_FILE = "weights.safetensors"
