"""What capture queued reaches the disk while the training thread is idle, and before a SIGTERM or
SIGINT takes effect.

A session writes its queue when a record comes (capture.py); a process asleep, or hung in a
collective, makes no record. One daemon thread per process, running while a session is open,
looks at the open sessions every `TICK_SECONDS` and has each write a queue no record joined for
`IDLE_SECONDS` since it last looked (`CaptureSession.write_idle`), so a record is on disk at most about
0.9 s after capture whatever the training thread does; while records come, a queue that waited a second
is marked due and written at the next record, so SIGKILL loses about the last second. Between two dumped steps the thread waits for the next step's session (starting
and joining one per step cost ~0.2 ms of CPU and ~0.6 ms of a step's time); it ends at `release()`
(the debugger's next step is not dumped, or it closed) or after `LINGER_SECONDS` without a session.

SIGTERM (a scheduler's timeout or pre-emption) and SIGINT run a handler, installed from the main
thread at the first session, that writes every open session's queue and then does what the process
would have done without msprobe: the handler installed before ours is called (SIGINT's raises
KeyboardInterrupt, whose exit flushes the rest), or, where there was none, the process dies of the
signal. A signal ignored, or handled outside Python, is left alone; a handler the user installs
later replaces ours.

Must not import torch or mindspore.
"""

import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.2
LINGER_SECONDS = 2.0

_sessions = set()  # open sessions (each unwatched at close)
_cond = threading.Condition()
_thread = None
_previous = {}  # signal number -> the handler ours replaced


def watch(session):
    """Write `session`'s idle queue from the flusher thread until `unwatch(session)`."""
    global _thread
    with _cond:
        _sessions.add(session)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="msprobe-flusher", daemon=True)
            _thread.start()
    _install_handlers()


def unwatch(session):
    """Stop watching `session` (the thread waits for the next one: see the module doc)."""
    with _cond:
        _sessions.discard(session)


def release():
    """End the thread now if no session is open: no thread through a step that is not dumped."""
    global _thread
    with _cond:
        if _sessions or _thread is None:
            return
        thread, _thread = _thread, None
        _cond.notify_all()
    if thread is not threading.current_thread():
        thread.join()


def _run():
    global _thread
    me = threading.current_thread()
    idle_since = None
    while True:
        with _cond:
            if _thread is not me:
                return
            sessions = list(_sessions)
            if sessions:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= LINGER_SECONDS:
                _thread = None  # a later watch() starts another
                return
        for session in sessions:
            try:
                session.write_idle()
            except Exception as e:  # noqa: BLE001 - the flusher never stops; the training thread meets it too
                logger.debug("msprobe: background flush: %r", e)
        sessions = session = None  # holding none while waiting: a closed session is freed at once
        with _cond:
            if _thread is not me:
                return
            _cond.wait(TICK_SECONDS)


def _after_fork():
    global _thread, _cond
    _thread = None  # the child has no flusher thread: the next watch() starts one
    _cond = threading.Condition()
    _sessions.clear()


os.register_at_fork(after_in_child=_after_fork)


def write_all(ending=False):
    """Write every open session's queue now (the signal handler). `ending`: the process dies next."""
    with _cond:
        sessions = list(_sessions)
    for session in sessions:
        try:
            session.write_now(ending)
        except Exception as e:  # noqa: BLE001 - a signal handler must reach the process's own handling
            logger.warning("msprobe: writing the dump at a signal failed: %r", e)


def _install_handlers():
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; a later session from it will
    for sig in (signal.SIGTERM, signal.SIGINT):
        if sig in _previous:
            continue
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN or previous is None:
            continue  # ignored on purpose, or handled outside Python
        signal.signal(sig, _on_signal)
        _previous[sig] = previous


def _on_signal(signum, frame):
    previous = _previous.get(signum, signal.SIG_DFL)
    write_all(ending=not callable(previous))
    if callable(previous):
        return previous(signum, frame)
    signal.signal(signum, signal.SIG_DFL)  # die of the signal, as without msprobe
    os.kill(os.getpid(), signum)
    return None
