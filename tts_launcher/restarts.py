"""A child the launcher keeps running (the front door, the gateway) and the backoff policy
that decides when tritonserver or a child is started again."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def stop_process(process: subprocess.Popen, grace: float, kill: bool = True) -> None:
    """SIGTERM, wait up to ``grace``, then SIGKILL (``kill``) or leave it running."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            if kill:
                process.kill()
                process.wait()


class RestartedChild:
    """A child the launcher keeps running (the gateway, the front door): started again after
    it exits, after the policy's backoff (a child that cannot start, on a taken port say, is not
    restarted once a second for ever); never given up on, since a launcher that stopped would
    turn a crash into an outage.

    ``live``: a liveness probe (the child's own answer, not its upstream's); once it has
    answered since its start, a child that does not answer for ``hang_s`` is killed and
    started again (a stopped or deadlocked process would hang every client). Until its first
    answer it has ``start_s`` (the front door measures a warm-up before it listens)."""

    PROBE_EVERY_S = 2.0

    def __init__(
        self,
        name: str,
        start: Callable[[], subprocess.Popen],
        policy: RestartPolicy,
        say: Callable[[str], None],
        live: Callable[[], bool] | None = None,
        hang_s: float = 10.0,
        start_s: float = 180.0,
        restarts=None,
        hangs=None,
    ) -> None:
        self.name, self.start, self.policy, self.say = name, start, policy, say
        self.live, self.hang_s, self.start_s = live, hang_s, start_s
        self._restarts, self._hangs = restarts, hangs  # Prometheus counters, or None
        self.process: subprocess.Popen | None = None
        self.due: float | None = None  # when it is started again
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

    def check(self, now: float) -> None:
        """Start it again when due."""
        if self.process and self.process.poll() is None and self.due is None:
            self._probe(now)
        if self.process and self.process.poll() is not None and self.due is None:
            code, delay = self.process.returncode, self.policy.next_delay(now)
            self.say(f"launcher: {self.name} exited ({code}){self.policy.again(delay)}")
            if self._restarts is not None:
                self._restarts.inc()
            self.due = now + delay
        if self.due is not None and now >= self.due:
            self._run()

    def stop(self, grace: float, kill: bool = True) -> None:
        if self.process:
            stop_process(self.process, grace, kill)


@dataclass
class RestartPolicy:
    """Restart a dead process after 1, 2, 4 ... (at most 30) s; once it has died more than
    ``max_restarts`` times within ``window_s``, it keeps dying: the waits go on doubling up to
    ``slow_s``, and it is still started again (a person is told; the service is not stopped,
    which would turn a crash into an outage)."""

    max_restarts: int = 5
    window_s: float = 600.0
    slow_s: float = 300.0
    times: list[float] = field(default_factory=list)

    def next_delay(self, now: float) -> float:
        self.times = [t for t in self.times if now - t < self.window_s]
        self.times.append(now)
        longest = self.slow_s if self.keeps_dying else min(30.0, self.slow_s)
        return float(min(longest, 2 ** (len(self.times) - 1)))

    @property
    def keeps_dying(self) -> bool:
        return len(self.times) > self.max_restarts

    def again(self, delay: float) -> str:
        """The rest of the line that says a process exited: when it starts again."""
        if not self.keeps_dying:
            return f"; starting it again in {delay:.0f} s"
        return (
            f" {len(self.times)} times within {self.window_s:.0f} s: it keeps dying (its error "
            f"is above); starting it again in {delay:.0f} s"
        )
