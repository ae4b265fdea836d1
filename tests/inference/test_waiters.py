"""Coroutine requests: results delivered per batch on the caller's loop, timeouts,
cancellation, failures alone — and the mailbox under its own threads."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from pyc_lab.inference.errors import BadRequestError, InferenceError, RequestTimeoutError
from pyc_lab.inference.waiters import LoopWaiter, Mailbox, mailbox_for
from tests.inference.test_server import Gated, rows


def test_results_posted_from_another_thread_arrive_in_one_loop_callback():
    """Everything posted while the loop is busy is delivered by one callback, each
    future its own value or error; a future already resolved is left as it is."""

    async def main():
        loop = asyncio.get_running_loop()
        box = Mailbox(loop)
        calls = []
        deliver = box._deliver

        def counted():
            calls.append(1)
            deliver()

        box._deliver = counted
        futs = [loop.create_future() for _ in range(50)]
        futs[7].cancel()
        err = ValueError("mine alone")

        def worker():
            for i, f in enumerate(futs):
                box.post(f, i != 3, err if i == 3 else i * 10)

        t = threading.Thread(target=worker)
        t.start()
        t.join()  # the loop has not run: every post waits in the mailbox
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(calls) == 1
        for i, f in enumerate(futs):
            if i == 3:
                assert f.exception() is err
            elif i == 7:
                assert f.cancelled()
            else:
                assert f.result() == i * 10

    asyncio.run(main())


def test_a_closed_loop_drops_late_results_without_raising():
    loop = asyncio.new_event_loop()
    fut = loop.create_future()
    box = Mailbox(loop)
    loop.close()
    box.post(fut, True, 1)  # nobody awaits it any more: dropped, no error
    assert not fut.done() and box._items == []


def test_a_finished_loop_is_not_kept_alive_by_its_mailbox_or_timeout_wheel():
    """The registries key loops weakly; their mailboxes and wheels must not hold them
    (else every ``asyncio.run`` of a long session stays in memory)."""
    import gc
    import weakref

    from pyc_lab.inference import waiters

    gone = []
    for _ in range(3):
        async def main():
            loop = asyncio.get_running_loop()
            mailbox_for(loop)
            waiters.timeouts_for(loop)
            gone.append(weakref.ref(loop))

        asyncio.run(main())
    gc.collect()
    assert [ref() for ref in gone] == [None, None, None]
    assert not any(ref() in waiters._MAILBOXES for ref in gone)
    box = Mailbox(asyncio.new_event_loop())  # its loop dropped at once
    gc.collect()
    fut_loop = asyncio.new_event_loop()
    box.post(fut_loop.create_future(), True, 1)  # no loop to deliver to: dropped
    assert box.loop is None and box._items == []
    fut_loop.close()


def test_one_mailbox_per_loop_and_waiter_state():
    async def main():
        loop = asyncio.get_running_loop()
        assert mailbox_for(loop) is mailbox_for(loop)
        w = LoopWaiter(loop)
        assert w.set_running_or_notify_cancel() and not w.done()
        w.set_result(5)
        assert await w.future == 5
        assert w.done() and not w.set_running_or_notify_cancel()

    asyncio.run(main())


def test_async_requests_get_their_own_rows_and_fail_alone(start, affine):
    gated = Gated(affine)
    gated.gate.set()
    server = start(gated, max_batch=8, max_delay_ms=5)
    xs = [rows(1, 4 * i) for i in range(12)]
    poisoned = rows(1)
    poisoned[0, 0] = 666

    async def main():
        return await asyncio.gather(*[server.predict_async(x) for x in xs],
                                    server.predict_async(poisoned), return_exceptions=True)

    got = asyncio.run(main())
    for x, y in zip(xs, got[:-1], strict=True):
        np.testing.assert_array_equal(y, x * 2 + 1)
    assert isinstance(got[-1], InferenceError) and "poisoned" in str(got[-1])


def test_an_async_request_past_its_timeout_fails_and_is_skipped(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=1, max_delay_ms=0)

    async def main():
        first = asyncio.ensure_future(server.predict_async(rows(1)))
        while not gated.entered.is_set():
            await asyncio.sleep(0.005)
        with pytest.raises(RequestTimeoutError, match="no result within"):
            await server.predict_async(rows(1, 100), timeout_s=0.05)
        gated.gate.set()
        np.testing.assert_array_equal(await first, rows(1) * 2 + 1)
        np.testing.assert_array_equal(await server.predict_async(rows(1, 8)),
                                      rows(1, 8) * 2 + 1)

    asyncio.run(main())
    # the timed-out request never reached the model: two batches of one row ran
    assert gated.batches == [1, 1]


def test_a_cancelled_coroutine_request_is_skipped(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=1, max_delay_ms=0)

    async def main():
        first = asyncio.ensure_future(server.predict_async(rows(1)))
        while not gated.entered.is_set():
            await asyncio.sleep(0.005)
        doomed = asyncio.ensure_future(server.predict_async(rows(1, 100)))
        await asyncio.sleep(0.01)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        gated.gate.set()
        await first
        await server.predict_async(rows(1, 8))

    asyncio.run(main())
    assert gated.batches == [1, 1]


def test_resolve_sends_a_batch_to_each_loop_once_and_sets_plain_futures():
    from concurrent.futures import Future

    from pyc_lab.inference.waiters import resolve

    async def main():
        loop = asyncio.get_running_loop()
        box = mailbox_for(loop)
        posts = []
        real = box.post_many

        def counted(items):
            posts.append(len(items))
            real(items)

        box.post_many = counted
        try:
            waiters = [LoopWaiter(loop) for _ in range(5)]
            plain = Future()
            done = threading.Event()
            t = threading.Thread(target=lambda: (resolve(
                [(w, k) for k, w in enumerate(waiters)] + [(plain, "p")]), done.set()))
            t.start()
            t.join()
            assert done.is_set() and plain.result(timeout=1) == "p"
            assert [await w.future for w in waiters] == [0, 1, 2, 3, 4]
            assert posts == [5]
        finally:
            del box.post_many

    asyncio.run(main())


def test_the_timeout_wheel_fails_only_what_is_late_and_holds_only_what_is_in_flight():
    from pyc_lab.inference.waiters import TIMEOUT_GRANULARITY_S, timeouts_for

    async def main():
        loop = asyncio.get_running_loop()
        wheel = timeouts_for(loop)
        assert timeouts_for(loop) is wheel
        late, answered = loop.create_future(), loop.create_future()
        t0 = loop.time()
        slot_late = wheel.add(late, 0.02, "late one")
        slot_ok = wheel.add(answered, 0.02, "never shown")
        answered.set_result(1)
        wheel.discard(slot_ok, answered)
        with pytest.raises(RequestTimeoutError, match="late one"):
            await late
        waited = loop.time() - t0
        assert waited + 1e-3 >= 0.02 and waited < 0.02 + TIMEOUT_GRANULARITY_S + 0.05
        assert answered.result() == 1 and slot_late == slot_ok
        # many answered requests leave nothing behind once their slots pass
        futs = [loop.create_future() for _ in range(1000)]
        slots = [wheel.add(f, 0.01, "x") for f in futs]
        for f, s in zip(futs, slots, strict=True):
            f.set_result(None)
            wheel.discard(s, f)
        assert len(wheel) == 0
        await asyncio.sleep(0.01 + 2 * TIMEOUT_GRANULARITY_S)
        assert not wheel._slots

    asyncio.run(main())


def test_the_fast_request_check_agrees_with_the_full_one(start, affine):
    server = start(affine, max_batch=8)
    b = server._batcher(None)
    x = rows(3)
    fast = b.check([x])
    assert b._fast_check([x]) is not None
    b._fast_check = lambda arrays: None
    full = b.check([x])
    assert fast[1:] == full[1:]
    np.testing.assert_array_equal(fast[0][0], full[0][0])
    del b._fast_check
    # what the fast path does not take goes to the full check, which explains
    for bad, match in (([x[:, :3]], "axis 1 is 3"), ([x.astype(np.complex64)], "cannot be"),
                       ([rows(9)], "larger than max_batch")):
        with pytest.raises(BadRequestError, match=match):
            b.check(bad)
    np.testing.assert_array_equal(b.check([x.T.copy().T])[0][0], x)  # F-order: copied


def test_the_fast_check_never_lets_a_wrong_fixed_dimension_through(start):
    """A model with a free dimension besides the batch: the fast path steps aside and
    the full check still refuses a wrong fixed dimension."""
    from pyc_lab.inference.model import load

    def scale(x):
        return x * np.float32(2)

    model = load(scale, inputs={"x": ("float32", (None, None, 4))}, outputs=["y"])
    server = start(model, max_batch=8)
    b = server._batcher(None)
    ok = np.ones((2, 3, 4), np.float32)
    assert b._fast_check([ok]) is None
    assert b.check([ok])[1] == 2
    with pytest.raises(BadRequestError, match="axis 2 is 5"):
        b.check([np.ones((2, 3, 5), np.float32)])


@pytest.mark.parametrize("features", [4, 8, 64])  # at, below and above the small-sum path
def test_the_batch_finiteness_test_refuses_every_non_finite_value_and_keeps_finite_ones(
        start, features):
    """:meth:`Batcher._finite` on gathered batches: any NaN or infinity anywhere makes it
    false; finite values, -0.0 and float32's largest included, keep it true."""
    from pyc_lab.inference.model import load

    def scale(x):
        return x * np.float32(2)

    model = load(scale, inputs={"x": ("float32", (None, features))}, outputs=["y"])
    b = start(model, max_batch=8)._batcher(None)
    rng = np.random.default_rng(features)
    for n in (1, 4):
        x = rng.standard_normal((n, features)).astype(np.float32)
        x[0, 0] = -0.0
        assert b._finite([x])
        for bad in (np.nan, np.inf, -np.inf):
            for pos in [(0, 0), (n - 1, features - 1), (n // 2, features // 2)]:
                y = x.copy()
                y[pos] = bad
                assert not b._finite([y]), (bad, pos)
        y = x.copy()
        y[0, 0], y[n - 1, 1] = np.inf, -np.inf  # they would cancel in a careless sum
        assert not b._finite([y])
        big = np.full((n, features), np.finfo(np.float32).max, np.float32)
        big[0, 0] = -0.0
        assert b._finite([big])
    allow = start(model, max_batch=8, nan_policy="allow")._batcher(None)
    assert allow._finite([np.full((2, features), np.nan, np.float32)])


def _each_called_once_with_its_rows_but_the_poisoned(got: dict, xs: list) -> None:
    """Callback k got (its rows of 2 x + 1, None) once; the one after ``xs`` (the
    poisoned row) got (None, its error) once."""
    assert all(len(v) == 1 for v in got.values())
    for k, x in enumerate(xs):
        (outputs, error), = got[k]
        assert error is None
        np.testing.assert_array_equal(outputs, x * 2 + 1)
    (outputs, error), = got[len(xs)]
    assert outputs is None and isinstance(error, InferenceError) and "poisoned" in str(error)


def test_callback_requests_get_their_own_rows_once_and_fail_alone(start, affine):
    """``request_with_callback``: each caller's callback is called once, on its loop's
    thread, with its own rows; a request failing inside a batch gets its error alone; a
    callback that raises is reported to the loop and the rest of its delivery goes on;
    a bad request raises at once and is never called back."""
    gated = Gated(affine)
    server = start(gated, max_batch=8, max_delay_ms=50)
    xs = [rows(1 + i % 3, 10 * i) for i in range(9)]
    poisoned = rows(1)
    poisoned[0, 0] = 666

    async def main():
        loop = asyncio.get_running_loop()
        reported = []
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx["exception"]))
        got: dict[int, list] = {}
        me = threading.get_ident()
        all_in = loop.create_future()

        def callback(k):
            def answered(outputs, error):
                assert threading.get_ident() == me
                got.setdefault(k, []).append((outputs, error))
                if k == 4:
                    raise RuntimeError("the caller's own bug")
                if len(got) == len(xs) + 1 and not all_in.done():
                    all_in.set_result(None)
            return answered

        for k, x in enumerate([*xs, poisoned]):
            server.request_with_callback(loop, callback(k), (x,))
        with pytest.raises(BadRequestError):
            server.request_with_callback(loop, callback(99), (np.ones((1, 5), np.float32),))
        gated.gate.set()
        await asyncio.wait_for(all_in, 10)
        await asyncio.sleep(0.05)  # nothing more arrives
        return got, reported

    got, reported = asyncio.run(main())
    assert sorted(got) == list(range(len(xs) + 1))
    _each_called_once_with_its_rows_but_the_poisoned(got, xs)
    assert len(reported) == 1 and "own bug" in str(reported[0])


def test_a_callback_request_times_out_once_and_leaves_no_timeout_behind(start, affine):
    from pyc_lab.inference.waiters import timeouts_for

    gated = Gated(affine)
    server = start(gated, max_batch=1, max_delay_ms=0)

    async def main():
        loop = asyncio.get_running_loop()
        calls: list[tuple] = []
        first = loop.create_future()
        server.request_with_callback(loop, lambda o, e: first.set_result((o, e)),
                                     (rows(1),), timeout_s=5.0)
        while not gated.entered.is_set():
            await asyncio.sleep(0.005)
        server.request_with_callback(loop, lambda o, e: calls.append((o, e)),
                                     (rows(1, 100),), timeout_s=0.03)
        assert len(timeouts_for(loop)) == 2
        await asyncio.sleep(0.1)
        assert len(calls) == 1 and calls[0][0] is None
        assert isinstance(calls[0][1], RequestTimeoutError)
        gated.gate.set()
        outputs, error = await asyncio.wait_for(first, 10)
        assert error is None
        np.testing.assert_array_equal(outputs, rows(1) * 2 + 1)
        assert len(timeouts_for(loop)) == 0  # the answer dropped its timeout
        await asyncio.sleep(0.05)
        return calls

    calls = asyncio.run(main())
    assert len(calls) == 1  # never called back again
    assert gated.batches == [1]  # the timed-out request was skipped


def test_loop_callback_state():
    from pyc_lab.inference.waiters import LoopCallback

    seen = []
    cb = LoopCallback(lambda o, e: seen.append((o, e)))
    assert not cb.done() and cb.cancel() and cb.done() and not cb.cancel()
    cb.set_result(1)
    cb.set_exception(ValueError())
    assert seen == []  # cancelled: never called back
    cb = LoopCallback(lambda o, e: seen.append((o, e)))
    cb.set_result(2)
    cb.set_result(3)
    cb.set_exception(ValueError())
    assert seen == [(2, None)] and cb.done()


def test_thread_callback_state(caplog):
    from pyc_lab.inference.waiters import ThreadCallback

    calls = []
    cb = ThreadCallback(lambda o, e: calls.append((o, e)))
    assert cb.set_running_or_notify_cancel() and not cb.done()
    cb.set_result(1)
    cb.set_result(2)
    cb.set_exception(ValueError("late"))
    assert calls == [(1, None)] and cb.done() and not cb.set_running_or_notify_cancel()
    cancelled = ThreadCallback(lambda o, e: calls.append((o, e)))
    assert cancelled.cancel() and not cancelled.cancel()
    cancelled.set_result(3)
    assert calls == [(1, None)]

    def broken(o, e):
        raise RuntimeError("the caller's own bug")

    with caplog.at_level("ERROR", logger="pyc_lab.inference.waiters"):
        ThreadCallback(broken).set_exception(ValueError("x"))  # logged, not raised
    assert "callback raised" in caplog.text and "own bug" in caplog.text


def test_worker_thread_callbacks_get_their_own_rows_once_and_fail_alone(start, affine):
    """``request_with_callback(None, ...)``: each caller's callback runs once, on the
    batcher's thread, with its own rows; a request failing inside a batch gets its
    error alone; one past its timeout in the queue gets a timeout; a callback that
    raises leaves the batcher serving."""
    gated = Gated(affine)
    server = start(gated, max_batch=8, max_delay_ms=50)
    got: dict[int, list] = {}
    threads: set[str] = set()
    all_in = threading.Event()
    xs = [rows(1 + i % 3, 10 * i) for i in range(9)]
    poisoned = rows(1)
    poisoned[0, 0] = 666

    def callback(k):
        def answered(outputs, error):
            threads.add(threading.current_thread().name)
            got.setdefault(k, []).append((outputs, error))
            if len(got) == len(xs) + 2:
                all_in.set()
            if k == 4:
                raise RuntimeError("the caller's own bug")
        return answered

    for k, x in enumerate([*xs, poisoned]):
        server.request_with_callback(None, callback(k), (x,))
    server.request_with_callback(None, callback(99), (rows(1, 500),), timeout_s=0.01)
    with pytest.raises(BadRequestError):
        server.request_with_callback(None, callback(98), (np.ones((1, 5), np.float32),))
    time.sleep(0.05)  # the short timeout passes while its batch is held
    gated.gate.set()
    assert all_in.wait(10)
    time.sleep(0.05)  # nothing more arrives
    assert threads == {f"pyc-lab-batcher-{gated.name}"}
    assert sorted(got) == [*range(len(xs) + 1), 99]
    _each_called_once_with_its_rows_but_the_poisoned(got, xs)
    (outputs, error), = got[99]
    assert outputs is None and isinstance(error, RequestTimeoutError)
    np.testing.assert_array_equal(server.predict(rows(2)), rows(2) * 2 + 1)
