"""Errors the models turn into per-request Triton errors."""


class InvalidInputError(ValueError):
    """A request's input is unusable; the message tells the caller what to fix."""


class ModelConfigError(ValueError):
    """A model's config.pbtxt is inconsistent; raised in ``initialize`` so loading fails."""


class PhonemizerCrashError(InvalidInputError):
    """The text killed espeak-ng twice: a client error, never to be read as "nothing to say"."""


class CorruptInputError(Exception):
    """An input another stage produced arrived changed: INTERNAL for its request alone, with a
    message that tells the operator what to change (never the client's fault)."""
