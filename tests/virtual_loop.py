"""An asyncio event loop in virtual time: when nothing is ready to run, the clock jumps to the next timer.

Time-based logic that waits with the loop's own timers (asyncio.sleep, asyncio.timeout, wait_for) runs at
once, deterministically: a 600 s buffer timeout takes no wall time. No I/O should be pending while the
clock jumps; the tests that use it talk to fakes, not sockets.
"""

from __future__ import annotations

import asyncio
import heapq


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def _run_once(self) -> None:
        while self._scheduled and self._scheduled[0]._cancelled:  # a cancelled timer is no reason to jump
            heapq.heappop(self._scheduled)._scheduled = False
        if not self._ready and self._scheduled:
            self._virtual_now = max(self._virtual_now, self._scheduled[0]._when)
        super()._run_once()


def run_virtual(coro):
    """Run `coro` to completion on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def settle(limit: int = 10_000) -> None:
    """Let every callback that is ready now run (and what they make ready in turn) before going on: what a
    simulator does within one event at one instant, the replay does before the clock moves."""
    loop = asyncio.get_running_loop()
    for _ in range(limit):
        if not loop._ready:  # noqa: SLF001 - the loop's own queue of ready callbacks
            return
        await asyncio.sleep(0)
