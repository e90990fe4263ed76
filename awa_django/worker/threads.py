"""The thread pool that runs sync handlers, with threads a stuck handler cannot pin down.

``concurrent.futures.ThreadPoolExecutor`` has a fixed number of non-daemon threads, and the
interpreter joins them at exit: a handler that never returns keeps its thread (and so a slot of
the pool) forever, and keeps the process from exiting. Here the threads are daemon threads, and
a thread whose handler the runtime gives up on is *retired*: it no longer counts against the
pool's size (a new thread takes its place when work is waiting) and it ends when its handler
finally returns. Python cannot kill a thread; this is the most a process can do short of
exiting, which the runtime does when too many retired threads pile up.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

__all__ = ["HandlerThreads"]

P = ParamSpec("P")
T = TypeVar("T")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class HandlerThreads(Executor):
    """A pool of at most ``size`` working daemon threads (retired ones not counted)."""

    def __init__(self, size: int, *, name: str = "awa-job") -> None:
        self.size = max(1, size)
        self.name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()  # working, not retired
        self._retired: set[threading.Thread] = set()
        self._idle = 0
        self._shutdown = False
        self._count = 0

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; start a thread when none is idle and the pool has
        room."""
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the handler pool is shut down")
            self._work.put((future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self.size:
                self._start_thread()
            else:
                self._idle = max(0, self._idle - 1)
        return future

    def retire(self, thread: threading.Thread) -> None:
        """Stop counting ``thread`` (running a handler the runtime gave up on) against the pool;
        it exits when that handler returns. A replacement starts if work is waiting."""
        with self._lock:
            if thread not in self._threads:
                return
            self._threads.discard(thread)
            self._retired.add(thread)
            if not self._shutdown and not self._work.empty():
                self._start_thread()

    def retired_alive(self) -> int:
        """How many retired threads are still running their handler."""
        with self._lock:
            self._retired = {t for t in self._retired if t.is_alive()}
            return len(self._retired)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; with ``cancel_futures``, cancel what has not started. Threads are
        daemons: a stuck handler never keeps the process from exiting. ``wait`` joins only the
        working (not retired) threads."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _start_thread(self) -> None:
        self._count += 1
        thread = threading.Thread(target=self._loop, name=f"{self.name}-{self._count}", daemon=True)
        self._threads.add(thread)
        thread.start()

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)
            del item, future, fn, args, kwargs
            with self._lock:
                if me in self._retired or self._shutdown:
                    self._retired.discard(me)
                    return
                self._idle += 1
