"""A child the launcher keeps running (the front door, the gateway) and the backoff policy
that decides when tritonserver or a child is started again."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .processes import stop_process


class RestartedChild:
    """A child the launcher keeps running (the gateway, the front door): started again after
    it exits, after the policy's backoff, until the policy gives up (a taken port made it
    restart once a second for ever before), or, with ``give_up=False``, every 30 s for ever.

    ``live``: a liveness probe (the child's own answer, not its upstream's); once it has
    answered since its start, a child that does not answer for ``hang_s`` is killed and
    started again (a stopped or deadlocked process hung every client before). Until its first
    answer it has ``start_s`` (the front door measures a warm-up before it listens)."""

    PROBE_EVERY_S = 2.0

    def __init__(
        self,
        name: str,
        start: Callable[[], subprocess.Popen],
        policy: RestartPolicy,
        say: Callable[[str], None],
        live: Callable[[], bool] | None = None,
        give_up: bool = True,
        hang_s: float = 10.0,
        start_s: float = 180.0,
        restarts=None,
        hangs=None,
    ) -> None:
        self.name, self.start, self.policy, self.say = name, start, policy, say
        self.live, self.give_up, self.hang_s, self.start_s = live, give_up, hang_s, start_s
        self._restarts, self._hangs = restarts, hangs  # Prometheus counters, or None
        self.process: subprocess.Popen | None = None
        self.due: float | None = None  # when it is started again
        self.gave_up = False
        self._run()

    def _run(self) -> None:
        self.process, self.due = self.start(), None
        self._started = self._probed = time.monotonic()
        self._answered: float | None = None  # its last answer to the probe since it started

    def _probe(self, now: float) -> None:
        """Kill it when it has stopped answering its liveness probe."""
        if not self.live or now - self._probed < self.PROBE_EVERY_S:
            return
        self._probed = now
        if self.live():
            self._answered = now
            return
        since = self._answered if self._answered is not None else self._started
        allowed = self.hang_s if self._answered is not None else self.start_s
        if now - since > allowed:
            self.say(
                f"launcher: {self.name} has not answered its liveness probe for "
                f"{now - since:.0f} s; killing it to start it again"
            )
            if self._hangs is not None:
                self._hangs.inc()
            self.process.kill()
            self.process.wait()

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process else []

    def check(self, now: float) -> bool:
        """Start it again when due; False once it has died too often (the launcher stops)."""
        if self.process and self.process.poll() is None and self.due is None:
            self._probe(now)
        if self.process and self.process.poll() is not None and self.due is None:
            code = self.process.returncode
            delay = self.policy.next_delay(now)
            if delay is None and self.give_up:
                self.say(
                    f"launcher: {self.name} exited ({code}) {self.policy.describe()}; "
                    "giving up (its error is above)"
                )
                self.gave_up = True
                return False
            if delay is None:
                delay = 30.0
                self.say(
                    f"launcher: {self.name} exited ({code}) {self.policy.describe()}; "
                    "tritonserver keeps serving, trying it again every 30 s (its error is above)"
                )
            else:
                self.say(
                    f"launcher: {self.name} exited ({code}); starting it again in {delay:.0f} s"
                )
            if self._restarts is not None:
                self._restarts.inc()
            self.due = now + delay
        if self.due is not None and now >= self.due:
            self._run()
        return True

    def stop(self, grace: float, kill: bool = True) -> None:
        if self.process:
            stop_process(self.process, grace, kill)


@dataclass
class RestartPolicy:
    """Restart a dead tritonserver after 1, 2, 4 ... (at most 30) s, but not more than
    ``max_restarts`` times within ``window_s``: a server that keeps dying needs a person."""

    max_restarts: int = 5
    window_s: float = 600.0
    times: list[float] = field(default_factory=list)

    def next_delay(self, now: float) -> float | None:
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.max_restarts:
            return None
        self.times.append(now)
        return float(min(30, 2 ** (len(self.times) - 1)))

    def describe(self) -> str:
        return f"{len(self.times)} times within {self.window_s:.0f} s"
