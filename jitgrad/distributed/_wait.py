"""Completing MPI requests within a time limit. MPI's blocking calls cannot be bounded, so
every blocking collective here is a nonblocking one finished by this poll: MPI progresses
a request only inside MPI calls, so the poll calls Testall in a tight loop while the other
ranks are likely to be arriving (the first SPIN_S seconds: what a collective between
ranks in step takes), then sleeps between tests, doubling the pause up to MAX_SLEEP_S, so
that a rank waiting for a slow peer leaves the cores to it (ranks often outnumber cores)."""
import time

SPIN_S = 2e-3
MIN_SLEEP_S = 2e-5
MAX_SLEEP_S = 1e-3


def wait_all(MPI, requests, statuses, seconds):
    """True once all `requests` completed (filling `statuses`, a list of MPI.Status or
    None), False if `seconds` passed first (the requests are then still pending)."""
    test = MPI.Request.Testall
    if test(requests, statuses):
        return True
    now = time.perf_counter()
    deadline, spin_end = now + seconds, now + min(SPIN_S, seconds)
    while now < spin_end:
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
