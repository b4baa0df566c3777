"""Completing MPI requests within a time limit. MPI's blocking calls cannot be bounded, so
every blocking collective here is a nonblocking one finished by this poll. MPI progresses
a request only inside MPI calls, so the poll calls Testall in a loop while the other
ranks are likely to be arriving, then backs off:
  - for SPIN_S seconds, tight (a small collective between ranks in step);
  - until YIELD_S, yielding the core after each test (os.sched_yield): when ranks outnumber
    cores (3 ranks on 2), the rank being waited for may be waiting for this one's core,
    and a tight spin keeps it off (measured, 8-byte all-reduce on 3 ranks: 4.5 ms with a
    2 ms tight spin, 72 us with 50 us, 32 us with 10 us, MPICH's own wait 19 us; on 2
    ranks 5.2 us with 10 us or 50 us, 6.2 us with none);
  - then sleeping between tests, doubling the pause up to MAX_SLEEP_S, so that a rank
    waiting for a slow peer leaves the cores to it.
"""
import os
import time

SPIN_S = 1e-5
YIELD_S = 2e-3
MIN_SLEEP_S = 2e-5
MAX_SLEEP_S = 1e-3


def wait_all(MPI, requests, statuses, seconds):
    """True once all `requests` completed (filling `statuses`, a list of MPI.Status or
    None), False if `seconds` passed first (the requests are then still pending)."""
    test = MPI.Request.Testall
    if test(requests, statuses):
        return True
    now = time.perf_counter()
    deadline = now + seconds
    spin_end, yield_end = now + min(SPIN_S, seconds), now + min(YIELD_S, seconds)
    while now < spin_end:
        if test(requests, statuses):
            return True
        now = time.perf_counter()
    while now < yield_end:
        os.sched_yield()
        if test(requests, statuses):
            return True
        now = time.perf_counter()
    pause = MIN_SLEEP_S
    while now < deadline:
        time.sleep(min(pause, deadline - now))
        if test(requests, statuses):
            return True
        pause = min(2 * pause, MAX_SLEEP_S)
        now = time.perf_counter()
    return False
