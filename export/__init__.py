"""Turn a Piper VITS voice into the repository's acoustic and vocoder model files."""
