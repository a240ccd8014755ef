"""Run a launch plan (``torchrun``/``srun``) to its end: output, progress, stop signals, clean-up.

* The launcher starts in its own session, so a Ctrl-C in the terminal reaches the harness only;
  the harness decides what the job gets. On Linux the launcher also gets SIGTERM if the harness
  itself dies (``PR_SET_PDEATHSIG``), so a killed harness cannot orphan a job.
* SIGTERM, SIGINT or SIGHUP (its terminal closed) to the harness becomes one SIGTERM to every rank (``torchrun``
  mode: the launcher's children) or to ``srun`` (which forwards it to its tasks). The ranks finish their step,
  save once and exit 0; ``torchrun`` then ends normally. The signal the harness received is written
  first into ``<log_dir>/stop_signal`` (named to the ranks by ``STOP_NOTE_ENV``), and the ranks report
  the stop under it: a Ctrl-C is SIGINT in their line and in ``summary.json``. A second signal, a
  second or more after the first, kills the job at once (an earlier one is the same Ctrl-C delivered
  twice), and says what it interrupts: the ranks' save and report, or only their exit when
  ``summary.json`` is written already.
* The launcher's output (ranks' lines and its own) passes through: all of it into
  ``<log_dir>/launch.log``, the console without ``torchrun``'s own failure traceback (the harness
  prints a shorter report naming the first failing rank) and without the ranks' known third-party
  noise (the lines they mark, ``utils.quiet.MARK_ENV``, and the native libraries' lines of
  :data:`KNOWN_NATIVE_LINES`, which no rank can mark) unless ``verbose``. While the ranks are still
  starting, a progress line every ``PROGRESS_EVERY_S`` seconds of silence.
* When the launcher has exited, any rank process still alive is killed: nothing stays behind.
"""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, TextIO

from megatron.bridge.perf.harness.results import SUMMARY_NAME
from megatron.bridge.training.harness_surface import (
    STOP_NOTE_ENV,
    STOP_SIGNALS,
    inspect_checkpoint_dir,
    iteration_dir,
    staged_iterations,
)
from megatron.bridge.utils.owned_files import describe_os_error, make_dir, open_append, remove, replace_file
from megatron.bridge.utils.quiet import marked, unmarked

LAUNCH_LOG = "launch.log"
PROGRESS_EVERY_S = 15.0
TICK_S = 0.5
DRAIN_S = 2.0
SAME_REQUEST_S = 1.0
"""A second signal within this time of the first is the same request (a terminal's Ctrl-C reaches
both ``uv run`` and the harness, and ``uv run`` passes its copy on): only a later one kills."""
StopTarget = Literal["ranks", "launcher"]
HARNESS_STOP_SIGNALS = (*STOP_SIGNALS, signal.SIGHUP)
"""What stops a job gracefully: the ranks' stop signals, and SIGHUP (the harness's terminal closed)."""
STOP_NOTE_NAME = "stop_signal"
"""The file in the run directory that tells the ranks which signal the harness received."""

# torchrun's own lines: glog-style records of torch.distributed.elastic and its ChildFailedError
# traceback (the ranks' lines carry a "[default<N>]:" prefix instead).
_TORCHRUN_RECORD = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ .*torch/distributed/")
_TRACEBACK_START = "Traceback (most recent call last):"
_SRUN_LABEL = re.compile(r"^\s*\d+: ")
_RANK_PREFIX = re.compile(r"^(\[default\d+\]:|\s*\d+: )")

KNOWN_NATIVE_LINES: tuple[re.Pattern[str], ...] = (
    re.compile(r"DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed with code 35$"),
    re.compile(r"^USDT:.* SyncActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)$"),
)
"""Lines torch's profiler library (kineto) writes straight to a rank's stderr, past Python, when a
profiled run starts and stops: on a host without a CUDA driver (CPU smoke mode) it asks the driver for
GPUs and logs that it found none (CUDA error 35, insufficient driver: expected there, the CPU trace is
written all the same), and it logs the capture window's start and stop. The console leaves them out
unless ``verbose``; ``launch.log`` keeps them."""


def known_native_line(text: str) -> bool:
    """Whether a rank line (launcher prefix removed) is one of :data:`KNOWN_NATIVE_LINES`."""
    body = _RANK_PREFIX.sub("", text, count=1).strip()
    return any(pattern.search(body) for pattern in KNOWN_NATIVE_LINES)


@dataclass
class JobOutcome:
    """How a launched job ended."""

    exit_code: int
    stop_signal: int | None = None
    """The signal (SIGTERM/SIGINT/SIGHUP) that asked the job to stop, if one did."""
    killed: bool = False
    """A second signal killed the job (what the ranks had written by then stays)."""
    kill_signal: int | None = None
    """The second signal, the one that killed the job."""
    launcher_lines: list[str] = field(default_factory=list)
    """The launcher's own output lines (not the ranks'): exit codes and pids of failed ranks."""
    leftovers_killed: int = 0

    @property
    def stopped(self) -> bool:
        return self.stop_signal is not None


# --------------------------------------------------------------------------------------------- processes
def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            children.append(int(entry))
    return children


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
        return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _die_with_parent() -> None:
    """In the launcher, before exec: SIGTERM when the harness dies (Linux; harmless elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _signal(pid: int, sig: int, group: bool = False) -> None:
    """Signal ``pid`` (with ``group``: its whole process group when it leads one, as torchrun's
    ranks do, so that their data-loader workers go too); a process already gone is no error."""
    if group:
        try:
            os.killpg(pid, sig)
            return
        except OSError:
            pass
    try:
        os.kill(pid, sig)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------- signals
class StopForwarder:
    """Turns SIGTERM/SIGINT to the harness into a graceful stop of the job (a second: a kill).

    Installed before the launcher starts, so no signal finds the harness unguarded; a signal that
    arrives before :meth:`attach` means nothing is launched at all.
    """

    def __init__(
        self,
        target: StopTarget,
        announce: Callable[[str], None],
        log_dir: Path | None = None,
        save_dir: str | None = None,
    ) -> None:
        self.proc: subprocess.Popen | None = None
        self.target, self.announce = target, announce
        self.log_dir = log_dir
        """The run directory: the stop note goes into it, the ranks' ``summary.json`` is read from it."""
        self.save_dir = save_dir
        """The job's ``checkpoint.save`` (``None``: it saves nothing), read when a second signal comes."""
        self.signum: int | None = None
        self.killed = False
        self.kill_signal: int | None = None
        self.ranks: set[int] = set()
        self._signalled: set[int] = set()
        self._announced = False
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopForwarder:
        for sig in HARNESS_STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def attach(self, proc: subprocess.Popen) -> None:
        """The launcher to act on from now on."""
        self.proc = proc
        self.track()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            self._first_at = time.monotonic()
            self._write_note(signum)
            self.track()
        elif time.monotonic() - self._first_at < SAME_REQUEST_S:
            return  # one Ctrl-C delivered twice: by the terminal and by `uv run` passing it on
        elif not self.killed and self.proc is not None:
            self.killed, self.kill_signal = True, signum
            self.announce(self.kill_message(signum))
            self.kill()

    def _write_note(self, signum: int) -> None:
        """Tell the ranks which signal this was, before they get their SIGTERM (without a note, which
        a full disk may prevent, they report SIGTERM)."""
        if self.log_dir is None:
            return
        try:
            replace_file(self.log_dir / STOP_NOTE_NAME, signal.Signals(signum).name)
        except OSError:
            pass

    def ranks_finished(self) -> bool:
        """Whether the ranks have written ``summary.json``: their save (if any) is done, they are exiting."""
        return self.log_dir is not None and (self.log_dir / SUMMARY_NAME).is_file()

    def kill_message(self, signum: int) -> str:
        """What a second signal interrupts: only the ranks' exit (their save and report are written),
        or the job before they finished, and then what the checkpoint directory holds."""
        head = f"== second signal ({signal.Signals(signum).name})"
        if self.ranks_finished():
            return f"{head}: the ranks had already saved and written {SUMMARY_NAME}; killing them as they exit"
        return f"{head}: killing the job now, before the ranks have finished; {saved_state(self.save_dir)}"

    def track(self) -> None:
        """Remember the ranks started so far; a stop already asked for reaches late starters too."""
        if self.proc is None:
            return
        if self.target == "ranks" and self.proc.poll() is None:
            self.ranks.update(child_pids(self.proc.pid))
        if self.signum is not None and not self.killed:
            self._forward(self.proc, self.signum)

    def _forward(self, proc: subprocess.Popen, signum: int) -> None:
        if not self._announced:
            self._announced = True
            self.announce(
                f"== {signal.Signals(signum).name} received: asking the ranks to finish their step, "
                "save and exit (send it again, a second or more later, to kill the job at once)"
            )
        # srun forwards SIGTERM to every task; torchrun would tear the ranks down itself, so the
        # ranks are signalled directly and torchrun just sees them finish.
        targets = {proc.pid} if self.target == "launcher" else self.ranks
        for pid in targets - self._signalled:
            _signal(pid, signal.SIGTERM)
            self._signalled.add(pid)

    def kill(self) -> None:
        """Kill the ranks and the launcher at once (nothing to kill before :meth:`attach`)."""
        if self.proc is None:
            return
        for pid in self.ranks | set(child_pids(self.proc.pid)):
            _signal(pid, signal.SIGKILL, group=True)  # a rank leads its own process group
        _signal(self.proc.pid, signal.SIGKILL)

    def kill_leftovers(self, wait_s: float = 5.0) -> int:
        """Kill rank processes that outlived the launcher and wait until they are gone; returns
        how many there were."""
        left = [pid for pid in self.ranks if alive(pid)]
        for pid in left:
            _signal(pid, signal.SIGKILL, group=True)
        deadline = time.monotonic() + wait_s
        while any(alive(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(left)


def saved_state(save_dir: str | None) -> str:
    """What ``checkpoint.save`` holds: the latest complete checkpoint, and a save under way (which a
    kill leaves unpublished: the complete one stays the one a resume loads)."""
    if not save_dir:
        return "checkpoint.save is not set: nothing was to be saved"
    found = inspect_checkpoint_dir(save_dir)
    latest = found.iteration if found.resumable else None
    done = (
        f"the latest complete checkpoint is {iteration_dir(save_dir, latest)}"
        if latest is not None
        else "no checkpoint is complete"
    )
    under_way = [n for n in staged_iterations(save_dir) if latest is None or n > latest]
    return f"the save of iteration {under_way[-1]} under way is not kept; {done}" if under_way else done


# --------------------------------------------------------------------------------------------- output
class OutputPump:
    """Copies the launcher's output to ``launch.log`` (all of it, marks removed) and to the console
    (without the marked lines); keeps the launcher's lines."""

    def __init__(self, out: TextIO, log_path: Path, verbose: bool) -> None:
        self.out, self.verbose = out, verbose
        self.log_path = log_path
        self.log: IO[str] | None = open_append(log_path)
        self.launcher_lines: list[str] = []
        self.started = self.last_output = time.monotonic()
        self.first_iteration_seen = False
        self._held: list[str] | None = None

    def _emit(self, text: str) -> None:
        try:
            print(text, file=self.out, flush=True)
        except OSError:  # the terminal is gone (a closed SSH session): launch.log still has it all
            pass
        self.last_output = time.monotonic()

    def _log(self, text: str) -> None:
        """Append to ``launch.log``; when that fails (a full disk), say so once and go on without it."""
        if self.log is None:
            return
        try:
            self.log.write(text + "\n")
            self.log.flush()
        except OSError as exc:
            self._emit(
                f"warning: cannot write {self.log_path}: {describe_os_error(exc, self.log_path)}; the "
                "console keeps showing the run, the log stops here"
            )
            self._close_log()

    def _close_log(self) -> None:
        log, self.log = self.log, None
        if log is None:
            return
        try:
            log.close()
        except OSError:
            pass

    def line(self, text: str) -> None:
        quiet = marked(text)
        if quiet:
            text = unmarked(text)
        self._log(text)
        if quiet and not self.verbose:
            return  # known third-party noise: the log has it, the console does not
        if is_rank_line(text):
            self.first_iteration_seen = self.first_iteration_seen or "iteration " in text
            if self.verbose or not known_native_line(text):
                self._emit(text)
            return
        self.launcher_lines.append(text)
        if self.verbose:
            self._emit(text)
        elif self._held is not None or text.startswith(_TRACEBACK_START):
            self._held = (self._held or []) + [text]  # decided at the end: torchrun's failure block?
        elif not _TORCHRUN_RECORD.match(text):
            self._emit(text)

    def close(self) -> None:
        """Show a held traceback unless it is torchrun's ChildFailedError (the harness reports that)."""
        if self._held and not any("ChildFailedError" in text for text in self._held):
            for text in self._held:
                self._emit(text)
        self._held = None
        if self.log is not None:
            self._close_log()

    def tick(self) -> None:
        """A progress line when the ranks have been silent for a while before their first step."""
        now = time.monotonic()
        if not self.first_iteration_seen and now - self.last_output >= PROGRESS_EVERY_S:
            self._emit(f"   ... ranks still starting ({now - self.started:.0f} s since launch)")


def is_rank_line(text: str) -> bool:
    """A line a rank printed: ``torchrun --tee`` prefixes ``[default<N>]:``, ``srun --label`` ``<N>: ``."""
    return text.startswith("[default") or bool(_SRUN_LABEL.match(text))


def _pump(proc: subprocess.Popen, pump: OutputPump, on_tick: Callable[[], None]) -> None:
    """Stream until the launcher's output ends, or until ``DRAIN_S`` after the launcher exited
    (ranks that outlive it keep the pipe open; they are killed right after)."""
    if proc.stdout is None:
        raise ValueError("the launcher was started without a pipe for its output: there is nothing to stream")
    fd = proc.stdout.fileno()
    pending = b""
    exited_at: float | None = None
    while exited_at is None or time.monotonic() - exited_at < DRAIN_S:
        ready, _, _ = select.select([fd], [], [], TICK_S)
        on_tick()
        pump.tick()
        if exited_at is None and proc.poll() is not None:
            exited_at = time.monotonic()
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            pump.line(raw.decode(errors="replace"))
    if pending:
        pump.line(pending.decode(errors="replace"))


def supervise(
    argv: list[str],
    env: dict[str, str],
    log_dir: Path,
    target: StopTarget,
    out: TextIO | None = None,
    verbose: bool = False,
    save_dir: str | None = None,
) -> JobOutcome:
    """Start ``argv``, stream its output, forward stop signals; returns when it and its ranks are gone.
    ``save_dir``: the job's ``checkpoint.save``, for what a second signal says."""
    out = out or sys.stdout
    make_dir(log_dir, parents=True)
    remove(log_dir / STOP_NOTE_NAME)  # an earlier run's: this job's ranks read only this job's note
    forwarder = StopForwarder(target, lambda text: print(text, file=out, flush=True), log_dir, save_dir)
    with forwarder:
        if forwarder.signum is not None:  # stopped while the config was being written
            return JobOutcome(exit_code=0, stop_signal=forwarder.signum)
        proc = subprocess.Popen(
            argv,
            env={**env, STOP_NOTE_ENV: str(log_dir / STOP_NOTE_NAME)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        forwarder.attach(proc)
        pump = OutputPump(out, log_dir / LAUNCH_LOG, verbose)
        try:
            _pump(proc, pump, forwarder.track)
            code = proc.wait()
        finally:
            pump.close()
            if proc.poll() is None:  # the harness itself is failing: take the job with it
                forwarder.kill()
                proc.wait()
        # still under the forwarder: a stop signal now is the job's, not an interruption of the harness
        leftovers = forwarder.kill_leftovers()
    return JobOutcome(
        exit_code=code,
        stop_signal=forwarder.signum,
        killed=forwarder.killed,
        kill_signal=forwarder.kill_signal,
        launcher_lines=pump.launcher_lines,
        leftovers_killed=leftovers,
    )
