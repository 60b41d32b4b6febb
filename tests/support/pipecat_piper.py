"""Pipecat's ``PiperHttpTTSService`` in a Pipecat pipeline, as an app runs it, against a base
URL: speaks one text and prints one JSON line with the audio that came out (run by the agents
venv's Python, ``make agents-venv``; it imports nothing of this project)."""

import asyncio
import json
import sys

import aiohttp
from pipecat.frames.frames import EndFrame, ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.piper.tts import PiperHttpTTSService

RATE = 22050  # the pipeline's output rate: the voice's, so nothing is resampled


class Collect(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.audio, self.rates, self.errors = bytearray(), set(), []

    async def process_frame(self, frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio += frame.audio
            self.rates.add(frame.sample_rate)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
        await self.push_frame(frame, direction)


async def main(base_url: str, text: str, voice: str | None) -> None:
    async with aiohttp.ClientSession() as session:
        settings = PiperHttpTTSService.Settings(voice=voice) if voice else None
        tts = PiperHttpTTSService(base_url=base_url, aiohttp_session=session, settings=settings)
        out = Collect()
        task = PipelineTask(Pipeline([tts, out]), params=PipelineParams(audio_out_sample_rate=RATE))
        await task.queue_frames([TTSSpeakFrame(text), EndFrame()])
        await PipelineRunner(handle_sigint=False).run(task)
    print(
        json.dumps(
            {
                "bytes": len(out.audio),
                "rates": sorted(out.rates),
                "errors": out.errors,
                "head": out.audio[:64].hex(),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
