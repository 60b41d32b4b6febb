"""Synchronous client: ``TTSClient("grpc://localhost:8001").synthesize("Hello")``."""

from __future__ import annotations

import queue
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Literal
from urllib.parse import urlsplit

import numpy as np

from .audio import Audio
from .errors import InvalidInput, ServerUnavailable, TTSError, map_exception

DEFAULT_PORTS = {"grpc": 8001, "http": 8000}
DEFAULT_MODEL = "tts"
DEFAULT_STREAM_MODEL = "tts_stream"
# Longer texts than this go through the streaming model (one tts request holds ~180 characters).
LONG_TEXT_CHARS = 300


@dataclass(frozen=True)
class Endpoint:
    """Where the server is and which protocol to speak, parsed from a URL."""

    protocol: Literal["grpc", "http"]
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in DEFAULT_PORTS:
            raise ValueError(
                f"URL {url!r} must start with grpc:// or http:// (e.g. grpc://localhost:8001)"
            )
        if not parts.hostname:
            raise ValueError(f"URL {url!r} has no host")
        if parts.path not in ("", "/"):
            raise ValueError(f"URL {url!r} must not have a path")
        try:
            port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError:
            raise ValueError(f"URL {url!r} has an invalid port") from None
        return cls(parts.scheme, parts.hostname, port)  # type: ignore[arg-type]


def _check_text(text: str) -> None:
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a str, got {type(text).__name__}")


def build_inputs(
    module: ModuleType,
    text: str,
    speed: float = 1.0,
    noise_scale: float | None = None,
    noise_w: float | None = None,
    batched: bool = True,
) -> list:
    """InferInput list for one request (``module``: tritonclient.grpc or .http).

    ``batched``: the model has a batch dimension (``tts``: shape [1, 1]); ``tts_stream`` has
    none (shape [1]).
    """
    _check_text(text)
    shape = [1, 1] if batched else [1]
    text_in = module.InferInput("text", shape, "BYTES")
    text_in.set_data_from_numpy(np.array([text.encode("utf-8")], dtype=np.object_).reshape(shape))
    inputs = [text_in]
    for name, value in (("speed", speed), ("noise_scale", noise_scale), ("noise_w", noise_w)):
        if value is not None:
            tensor = module.InferInput(name, shape, "FP32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.float32).reshape(shape))
            inputs.append(tensor)
    return inputs


def sample_rate_from_config(config: dict) -> int:
    """The ``sample_rate`` parameter of a model config (dict from HTTP or gRPC as_json)."""
    config = config.get("config", config)
    try:
        return int(config["parameters"]["sample_rate"]["string_value"])
    except (KeyError, TypeError, ValueError):
        raise TTSError(
            f"model {config.get('name')!r} has no sample_rate parameter in its config"
        ) from None


def audio_from_result(result, sample_rate: int) -> Audio:
    samples = result.as_numpy("audio")
    if samples is None:
        raise TTSError("the server's response has no 'audio' output")
    return Audio(np.ascontiguousarray(samples.reshape(-1), dtype=np.float32), sample_rate)


class TTSClient:
    """Text to speech over Triton; the URL scheme picks gRPC or HTTP.

    Thread-safe for ``synthesize``; use as a context manager to close connections.
    """

    def __init__(
        self,
        url: str = "grpc://localhost:8001",
        model: str = DEFAULT_MODEL,
        timeout: float = 120.0,
        concurrency: int = 16,
        stream_model: str = DEFAULT_STREAM_MODEL,
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        self.model = model
        self.stream_model = stream_model
        self.timeout = timeout
        self.concurrency = concurrency
        self._sample_rate: int | None = None
        try:
            if self.endpoint.protocol == "grpc":
                import tritonclient.grpc as module

                self._client = module.InferenceServerClient(self.endpoint.address)
            else:
                import tritonclient.http as module

                self._client = module.InferenceServerClient(
                    self.endpoint.address,
                    concurrency=concurrency,
                    connection_timeout=timeout,
                    network_timeout=timeout,
                )
        except Exception as e:
            raise map_exception(e) from None
        self._module = module

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TTSClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def is_ready(self) -> bool:
        """True when the server and the model are ready to serve."""
        try:
            return bool(self._client.is_server_ready() and self._client.is_model_ready(self.model))
        except Exception:
            return False

    @property
    def sample_rate(self) -> int:
        """Read once from the model's config, so no client hard-codes it."""
        if self._sample_rate is None:
            try:
                if self.endpoint.protocol == "grpc":
                    config = self._client.get_model_config(self.model, as_json=True)
                else:
                    config = self._client.get_model_config(self.model)
            except Exception as e:
                raise map_exception(e) from None
            self._sample_rate = sample_rate_from_config(config)
        return self._sample_rate

    # -- synthesis -------------------------------------------------------------------------
    def synthesize(
        self,
        text: str,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
    ) -> Audio:
        """Speak ``text``; ``speed`` 2.0 is twice as fast. Noise 0 makes output repeatable.

        Over gRPC, text too long for one request goes through the streaming model and the
        chunks are joined.
        """
        rate = self.sample_rate
        if self.endpoint.protocol == "grpc" and len(text) > LONG_TEXT_CHARS:
            return self._joined_stream(text, speed, noise_scale, noise_w)
        inputs = build_inputs(self._module, text, speed, noise_scale, noise_w)
        try:
            if self.endpoint.protocol == "grpc":
                result = self._client.infer(self.model, inputs, client_timeout=self.timeout)
            else:
                result = self._client.infer(self.model, inputs)
        except Exception as e:
            error = map_exception(e)
            if isinstance(error, InvalidInput) and "too long" in str(error):
                if self.endpoint.protocol == "grpc":
                    return self._joined_stream(text, speed, noise_scale, noise_w)
                raise InvalidInput(f"{error}; over HTTP, split the text yourself") from None
            raise error from None
        return audio_from_result(result, rate)

    def _joined_stream(self, text, speed, noise_scale, noise_w) -> Audio:
        chunks = list(self.stream(text, speed, noise_scale, noise_w))
        return Audio(
            np.concatenate(chunks) if chunks else np.zeros(0, np.float32), self.sample_rate
        )

    def stream(
        self,
        text: str,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
    ) -> Iterator[np.ndarray]:
        """Yield the audio of ``text`` chunk by chunk, in order, as the server makes it (gRPC).

        Stopping the iteration early cancels the request on the server.
        """
        if self.endpoint.protocol != "grpc":
            raise TTSError("streaming needs a grpc:// URL (Triton streams over gRPC only)")
        import tritonclient.grpc as grpcclient

        inputs = build_inputs(grpcclient, text, speed, noise_scale, noise_w, batched=False)
        results: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.endpoint.address)  # one stream each
        finished = False
        try:
            client.start_stream(callback=lambda result, error: results.put((result, error)))
            client.async_stream_infer(self.stream_model, inputs, enable_empty_final_response=True)
            while True:
                try:
                    result, error = results.get(timeout=self.timeout)
                except queue.Empty:
                    raise ServerUnavailable(
                        f"no audio from the server in {self.timeout} s"
                    ) from None
                if error is not None:
                    raise map_exception(error)
                audio = result.as_numpy("audio")
                if audio is not None:
                    yield np.ascontiguousarray(audio.reshape(-1), dtype=np.float32)
                final = result.get_response().parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    finished = True
                    return
        except TTSError:
            raise
        except Exception as e:
            raise map_exception(e) from None
        finally:
            try:
                client.stop_stream(cancel_requests=not finished)
            finally:
                client.close()

    def synthesize_many(
        self,
        texts: Sequence[str],
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
    ) -> list[Audio]:
        """Send all texts at once so the server batches them; results in input order.

        Raises the first error (in input order) if any text fails.
        """
        if isinstance(texts, str):
            raise InvalidInput("synthesize_many takes a list of texts; use synthesize for one")
        rate = self.sample_rate
        if self.endpoint.protocol == "http":
            try:
                pending = [
                    self._client.async_infer(
                        self.model, build_inputs(self._module, t, speed, noise_scale, noise_w)
                    )
                    for t in texts
                ]
            except TTSError:
                raise
            except Exception as e:
                raise map_exception(e) from None
            results: list[Audio] = []
            for p in pending:
                try:
                    results.append(audio_from_result(p.get_result(), rate))
                except Exception as e:
                    raise map_exception(e) from None
            return results
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(texts)))) as pool:
            futures = [pool.submit(self.synthesize, t, speed, noise_scale, noise_w) for t in texts]
            return [f.result() for f in futures]

    def __repr__(self) -> str:
        return (
            f"TTSClient({self.endpoint.protocol}://{self.endpoint.address}, model={self.model!r})"
        )


__all__ = ["Endpoint", "TTSClient"]
