"""Results handed from the batcher's thread to coroutines, one wake-up per batch.

A coroutine awaiting a ``concurrent.futures.Future`` through ``asyncio.wrap_future``
pays for two futures, a condition variable and a thread-safe callback *per request*, and
the batcher's thread wakes the event loop once for every request of a batch. Under
closed-loop load (64 clients on one loop, the load generator and the HTTP endpoint) that
bookkeeping costs more interpreter time than the batch's GPU work.

:class:`LoopWaiter` is the batcher's completion handle for a request made from a
coroutine: an ``asyncio.Future`` of that loop, resolved through the loop's
:class:`Mailbox`, which collects every result posted while the loop has not yet run and
delivers them all in one ``call_soon_threadsafe`` callback. A request made with a
callback instead (:class:`LoopCallback`, the load generator's clients) has no
``asyncio.Future`` at all: the delivery calls it directly, without the loop scheduling a
done-callback per request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["TIMEOUT_GRANULARITY_S", "LoopCallback", "LoopWaiter", "Mailbox", "ThreadCallback",
           "TimeoutWheel", "mailbox_for", "resolve", "timeouts_for"]

#: Coroutine requests' timeouts fire at most this much late: their deadlines are rounded
#: up to a multiple of it, and one loop timer serves every request due in that slot.
TIMEOUT_GRANULARITY_S = 0.005

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = \
    weakref.WeakKeyDictionary()
_WHEELS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TimeoutWheel] = \
    weakref.WeakKeyDictionary()


class Mailbox:
    """Results for the futures of one event loop, delivered in batches on that loop.

    Holds the loop weakly: the module's registry keys mailboxes by their loops weakly,
    and a value that held its key would keep every loop ever used (each ``asyncio.run``
    makes one) alive for the life of the process.

    Parameters
    ----------
    loop
        The loop whose futures are resolved.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._items: list[tuple[asyncio.Future, bool, Any]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, future: asyncio.Future, ok: bool, value: Any) -> None:
        """Resolve ``future`` with ``value`` (a result if ``ok``, else an exception) on
        the loop, in its next delivery (one loop callback for everything posted until
        it runs). Safe from any thread."""
        self.post_many([(future, ok, value)])

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop (``None`` once it is gone)."""
        return self._loop()

    def post_many(self, items: list[tuple[asyncio.Future, bool, Any]]) -> None:
        """:meth:`post` for several ``(future, ok, value)`` at once (one lock, at most
        one loop callback)."""
        with self._lock:
            self._items.extend(items)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop = self._loop()
            if loop is None:
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            with self._lock:
                self._items.clear()
                self._scheduled = False
            log.debug("results arrived for a closed event loop; dropped them")

    def _deliver(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for future, ok, value in items:
            if future.done():  # cancelled, or timed out while it ran
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


def _dead() -> None:
    return None


#: The loop asked for last and its mailbox and wheel, held weakly: a request from the
#: loop of the one before skips the weak dictionaries' lookups (a Python-level call each).
_LAST: tuple[Any, Any, Any] = (_dead, _dead, _dead)


def _remember(loop: asyncio.AbstractEventLoop) -> tuple[Mailbox, TimeoutWheel]:
    with _LOCK:
        box = _MAILBOXES.get(loop)
        if box is None:
            box = _MAILBOXES[loop] = Mailbox(loop)
        wheel = _WHEELS.get(loop)
        if wheel is None:
            wheel = _WHEELS[loop] = TimeoutWheel(loop)
    global _LAST
    _LAST = (weakref.ref(loop), weakref.ref(box), weakref.ref(wheel))
    return box, wheel


def mailbox_for(loop: asyncio.AbstractEventLoop) -> Mailbox:
    """The :class:`Mailbox` of ``loop`` (one per loop, dropped with it)."""
    last = _LAST
    if last[0]() is loop:
        box = last[1]()
        if box is not None:
            return box
    return _remember(loop)[0]


class TimeoutWheel:
    """Timeouts of one loop's futures, one loop timer per slot of
    :data:`TIMEOUT_GRANULARITY_S` rather than one per future.

    ``loop.call_later`` per request (a timer handle and a heap entry, then a cancel)
    costs a few microseconds each; here a request joins its slot's set and leaves it
    when answered, so what is held is bounded by the requests in flight. Used from the
    loop's thread only.

    Parameters
    ----------
    loop
        The loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weakly, as a Mailbox
        self._slots: dict[int, dict[asyncio.Future, str]] = {}

    def add(self, future: asyncio.Future, timeout_s: float, message: str) -> int:
        """Fail ``future`` with :class:`~.errors.RequestTimeoutError` (``message``) if it
        is not done ``timeout_s`` from now (up to one granule later); returns the slot
        to :meth:`discard` it from."""
        loop = self._loop()  # alive: this runs on it
        slot = math.ceil((loop.time() + timeout_s) / TIMEOUT_GRANULARITY_S)
        members = self._slots.get(slot)
        if members is None:
            members = self._slots[slot] = {}
            loop.call_at(slot * TIMEOUT_GRANULARITY_S, self._expire, slot)
        members[future] = message
        return slot

    def discard(self, slot: int, future: asyncio.Future) -> None:
        """``future`` was answered: forget its timeout."""
        members = self._slots.get(slot)
        if members is not None:
            members.pop(future, None)

    def _expire(self, slot: int) -> None:
        from .errors import RequestTimeoutError

        for future, message in self._slots.pop(slot, {}).items():
            if not future.done():
                future.set_exception(RequestTimeoutError(message))

    def __len__(self) -> int:
        return sum(len(m) for m in self._slots.values())


def timeouts_for(loop: asyncio.AbstractEventLoop) -> TimeoutWheel:
    """The :class:`TimeoutWheel` of ``loop`` (one per loop, dropped with it)."""
    last = _LAST
    if last[0]() is loop:
        wheel = last[2]()
        if wheel is not None:
            return wheel
    return _remember(loop)[1]


class LoopCallback:
    """What a request made with a callback has in place of an ``asyncio.Future``: the
    part of one that :class:`Mailbox` and :class:`TimeoutWheel` use (``done``,
    ``set_result``, ``set_exception``), which calls ``callback(outputs, None)`` or
    ``callback(None, error)`` there and then — on the loop's thread, once — and drops
    the request's timeout. A future's result would instead be handed on by a
    done-callback the loop schedules (a handle and a turn of the loop per request).

    Parameters
    ----------
    callback
        ``callback(outputs, error)``; an exception it raises goes to the loop's
        exception handler and touches no other request.
    """

    __slots__ = ("_done", "_slot", "_wheel", "callback")

    def __init__(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        self.callback = callback
        self._done = False
        self._wheel: TimeoutWheel | None = None
        self._slot = 0

    def time_out(self, wheel: TimeoutWheel, timeout_s: float, message: str) -> None:
        """Fail with :class:`~.errors.RequestTimeoutError` (``message``) if not answered
        within ``timeout_s`` (:meth:`TimeoutWheel.add`); the answer drops the entry."""
        self._slot = wheel.add(self, timeout_s, message)
        self._wheel = wheel

    def done(self) -> bool:
        """Whether the callback was called (or the request cancelled)."""
        return self._done

    def cancel(self) -> bool:
        """Never call back (the batcher skips the request if it has not run)."""
        if self._done:
            return False
        self._finish()
        return True

    def set_result(self, value: Any) -> None:
        """Call back with the outputs (the one call a delivery makes per request: the
        steps of :meth:`_finish` and :meth:`_call` written out)."""
        if self._done:
            return
        self._done = True
        if self._wheel is not None:
            self._wheel.discard(self._slot, self)
            self._wheel = None
        try:
            self.callback(value, None)
        except Exception as err:
            _report(err)

    def set_exception(self, exc: BaseException) -> None:
        """Call back with the request's error."""
        if not self._done:
            self._finish()
            self._call(None, exc)

    def _finish(self) -> None:
        self._done = True
        if self._wheel is not None:
            self._wheel.discard(self._slot, self)
            self._wheel = None

    def _call(self, value: Any, exc: BaseException | None) -> None:
        try:
            self.callback(value, exc)
        except Exception as err:
            _report(err)


class ThreadCallback:
    """A request's completion handle that calls ``callback(outputs, None)`` — or
    ``callback(None, error)`` — on the batcher's worker thread, once, as the batch that
    ran it is answered: no future, no event loop, nothing handed to another thread (as
    ``concurrent.futures.Future.add_done_callback`` runs a callback where the result is
    set, without the future). For in-process callers that react at once — a load
    generator's closed-loop clients, perf_analyzer's in-process mode, whose callbacks
    run on the server's threads. The callback holds up the worker while it runs: it
    must be short and never wait for another request.

    Parameters
    ----------
    callback
        ``callback(outputs, error)``; an exception it raises is logged and touches no
        other request.
    """

    __slots__ = ("_done", "callback")

    def __init__(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        self.callback = callback
        self._done = False

    def set_running_or_notify_cancel(self) -> bool:
        """Whether the request should still run (not cancelled)."""
        return not self._done

    def done(self) -> bool:
        """Whether the callback was called (or the request cancelled)."""
        return self._done

    def cancel(self) -> bool:
        """Never call back (the batcher skips the request if it has not run)."""
        if self._done:
            return False
        self._done = True
        return True

    def set_result(self, value: Any) -> None:
        """Call back with the outputs."""
        if not self._done:
            self._done = True
            try:  # :meth:`_call`, inline: once per request
                self.callback(value, None)
            except Exception:
                log.exception("a request's callback raised (the other requests go on)")

    def set_exception(self, exc: BaseException) -> None:
        """Call back with the request's error."""
        if not self._done:
            self._done = True
            self._call(None, exc)

    def _call(self, value: Any, exc: BaseException | None) -> None:
        try:
            self.callback(value, exc)
        except Exception:
            log.exception("a request's callback raised (the other requests go on)")


def _report(err: Exception) -> None:
    """A request's callback raised (the caller's bug): to the loop's exception handler;
    the other requests of the delivery go on."""
    asyncio.get_running_loop().call_exception_handler(
        {"message": "a request's callback raised", "exception": err})


class LoopWaiter:
    """A request's completion handle for a coroutine or a loop callback: the batcher
    calls it like a ``concurrent.futures.Future``; the coroutine awaits :attr:`future`.

    Parameters
    ----------
    loop
        The running loop of the coroutine that will await the result (or of the
        callback).
    future
        What is resolved on that loop: a new ``asyncio.Future`` by default, or a
        :class:`LoopCallback`.
    """

    __slots__ = ("_box", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 future: asyncio.Future | LoopCallback | None = None) -> None:
        self.future: Any = loop.create_future() if future is None else future
        self._box = mailbox_for(loop)

    def set_running_or_notify_cancel(self) -> bool:
        """Whether the request should still run (not cancelled, not timed out)."""
        return not self.future.done()

    def done(self) -> bool:
        """Whether the awaited future is resolved (or cancelled)."""
        return self.future.done()

    def set_result(self, value: Any) -> None:
        """Hand the outputs to the awaiting coroutine."""
        self._box.post(self.future, True, value)

    def set_exception(self, exc: BaseException) -> None:
        """Hand the request's error to the awaiting coroutine."""
        self._box.post(self.future, False, exc)


def resolve(results: list[tuple[Any, Any]]) -> None:
    """Set each ``(handle, outputs)``'s result: a batch's coroutine requests go to their
    loops' mailboxes together (one lock and at most one wake-up per loop), other
    handles (``concurrent.futures.Future``) get theirs directly."""
    boxes: dict[int, tuple[Mailbox, list[tuple[asyncio.Future, bool, Any]]]] = {}
    for handle, value in results:
        if type(handle) is LoopWaiter:
            box = handle._box
            entry = boxes.get(id(box))
            if entry is None:
                entry = boxes[id(box)] = (box, [])
            entry[1].append((handle.future, True, value))
        else:
            handle.set_result(value)
    for box, items in boxes.values():
        box.post_many(items)
