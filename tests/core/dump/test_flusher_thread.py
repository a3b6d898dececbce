"""The flusher thread (core/dump/flusher.py) waits between dumped steps instead of being started and
joined per step, and is gone once the debugger says no step follows (release) or no session came for
LINGER_SECONDS."""

import threading
import time

from msprobe.core.dump import flusher


class _Session:
    def __init__(self):
        self.idle_writes = 0

    def write_idle(self):
        self.idle_writes += 1


def _flusher_threads():
    return [t for t in threading.enumerate() if t.name == "msprobe-flusher"]


def test_the_thread_waits_between_sessions_and_ends_at_release():
    first, second = _Session(), _Session()
    flusher.watch(first)
    try:
        [thread] = _flusher_threads()
        flusher.unwatch(first)
        assert thread.is_alive()  # waiting for the next step's session
        flusher.watch(second)
        assert _flusher_threads() == [thread]  # the same thread serves it
        deadline = time.monotonic() + 5
        while not second.idle_writes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.idle_writes  # and looks at it
        flusher.release()  # a session is open: the thread stays
        assert thread.is_alive()
    finally:
        flusher.unwatch(second)
        flusher.unwatch(first)
    flusher.release()
    assert not thread.is_alive() and not _flusher_threads()


def test_the_thread_ends_on_its_own_without_a_session():
    linger = flusher.LINGER_SECONDS
    flusher.LINGER_SECONDS = 0.3
    try:
        session = _Session()
        flusher.watch(session)
        [thread] = _flusher_threads()
        flusher.unwatch(session)
        thread.join(timeout=5)
        assert not thread.is_alive()
        flusher.watch(session)  # a later session starts another
        assert [t for t in _flusher_threads() if t is not thread]
        flusher.unwatch(session)
    finally:
        flusher.LINGER_SECONDS = linger
        flusher.release()
