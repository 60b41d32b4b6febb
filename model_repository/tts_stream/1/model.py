"""tts_stream: long text -> ordered audio chunks over a decoupled (streaming) response.

Chunks go to the `tts` ensemble with async BLS calls, so the dynamic batchers batch them with
every other user's requests; at most ``max_in_flight`` chunks of one stream wait at once.
"""

import asyncio
from collections import deque

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.config import parse_dataclass
from tts_serving.errors import InvalidInputError, ModelConfigError
from tts_serving.streaming import StreamSettings, finish_chunk, plan_chunks
from tts_serving.triton_adapter import ModelContext
from tts_serving.voice import (
    DEFAULT_MAX_PHONEME_IDS,
    Phonemizer,
    decode_text,
    load_voice_config,
    validate_noise,
    validate_speed,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INVALID_PREFIX = "invalid input: "  # the client maps stream errors by this prefix


class TritonPythonModel:
    def initialize(self, args):
        self.ctx = ModelContext.from_args(args)
        if not pb_utils.using_decoupled_model_transaction_policy(self.ctx.config):
            raise ModelConfigError("tts_stream needs model_transaction_policy { decoupled: true }")
        self.settings = parse_dataclass(StreamSettings, self.ctx.params)
        self.voice = load_voice_config(self.ctx.file("voice.json"))
        self.max_ids = int(self.ctx.params.get("max_phoneme_ids", DEFAULT_MAX_PHONEME_IDS))
        self.phonemizer = Phonemizer(self.voice, max_phoneme_ids=1 << 30)
        self.logger = pb_utils.Logger
        self.logger.log_info(f"tts_stream ready: {self.settings}")

    def count_ids(self, text):
        try:
            return len(self.phonemizer.ids(text))
        except InvalidInputError:
            return 0  # nothing speakable: tts will say so for this chunk

    def optional(self, request, name, default):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return default if tensor is None else float(tensor.as_numpy().reshape(-1)[0])

    async def execute(self, requests):
        # Decoupled + async: each stream runs concurrently with the others on the stub's loop.
        await asyncio.gather(*(self.stream(r) for r in requests))
        return None

    async def synthesize(self, text, extra_inputs):
        request = pb_utils.InferenceRequest(
            model_name="tts",
            requested_output_names=["audio"],
            inputs=[pb_utils.Tensor("text", np.array([[text.encode()]], dtype=np.object_))]
            + extra_inputs,
        )
        response = await request.async_exec()
        if response.has_error():
            error = response.error()
            if error.code() == pb_utils.TritonError.INVALID_ARG:
                raise InvalidInputError(error.message())
            raise RuntimeError(error.message())
        return pb_utils.get_output_tensor_by_name(response, "audio").as_numpy().reshape(-1)

    async def stream(self, request):
        sender = request.get_response_sender()
        pending = deque()
        sent = 0
        try:
            text_tensor = pb_utils.get_input_tensor_by_name(request, "text")
            text = decode_text(text_tensor.as_numpy().reshape(-1)[0])
            scalars = {"speed": validate_speed(self.optional(request, "speed", 1.0))}
            for name in ("noise_scale", "noise_w"):
                value = self.optional(request, name, None)
                if value is not None:  # absent: tts uses the voice's default
                    scalars[name] = validate_noise(name, value)
            extra = [pb_utils.Tensor(k, np.array([[v]], np.float32)) for k, v in scalars.items()]
            chunks = plan_chunks(text, self.settings, self.max_ids, self.count_ids)
            issued = 0
            while sent < len(chunks):
                if request.is_cancelled():
                    self.logger.log_info(f"tts_stream: cancelled after {sent}/{len(chunks)} chunks")
                    sender.send(
                        pb_utils.InferenceResponse(
                            error=pb_utils.TritonError(
                                "request cancelled", pb_utils.TritonError.CANCELLED
                            )
                        )
                    )
                    return
                # The first chunk goes alone, so it is not batched behind the chunks after it.
                window = 1 if sent == 0 else self.settings.max_in_flight
                while issued < len(chunks) and len(pending) < window:
                    pending.append(
                        asyncio.ensure_future(self.synthesize(chunks[issued].text, extra))
                    )
                    issued += 1
                audio = await pending.popleft()
                chunk = chunks[sent]
                last = sent == len(chunks) - 1
                audio = finish_chunk(
                    audio, self.voice.sample_rate, self.settings, chunk.sentence_end and not last
                )
                sender.send(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("audio", audio),
                            pb_utils.Tensor(
                                "chunk_text", np.array([chunk.text.encode()], dtype=np.object_)
                            ),
                        ]
                    )
                )
                sent += 1
        except InvalidInputError as e:
            # A gRPC stream carries only the message, not the code: the prefix says which it is.
            sender.send(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        f"{INVALID_PREFIX}{e}", pb_utils.TritonError.INVALID_ARG
                    )
                )
            )
        except Exception as e:  # a failure is an error the client sees, never a short stream
            self.logger.log_error(f"tts_stream failed after {sent} chunks: {e!r}")
            sender.send(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        f"tts_stream failed after {sent} chunks ({type(e).__name__}); "
                        "see the server log",
                        pb_utils.TritonError.INTERNAL,
                    )
                )
            )
        finally:
            for task in pending:
                task.cancel()
            sender.send(flags=FINAL)
