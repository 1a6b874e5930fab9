"""The one network policy: how often and how long every network step retries, and how long
one call may take. Git fetches (gitfetch.py), index probes and page reads (pydeps.py,
resolver.py) and image pushes (assembly/release.py) all retry through `retrying()`; the tools that
retry on their own get the same number (pip's --retries, uv's UV_HTTP_RETRIES).

Environment (settings.py reads it; asked at each call, so a test or a CI step can change it):
    MTP_NET_RETRIES       attempts per network step, first one included (default 3)
    MTP_NET_BACKOFF_MAX   longest wait between attempts, seconds (default 8); waits grow
                          exponentially from 0.5 s up to it
    MTP_HTTP_TIMEOUT      one HTTP request, seconds (default 20)
    MTP_GIT_TIMEOUT       one git call, seconds (default 300)
What is transient is the caller's to say (a refused push is not, a cut connection is).
"""

from __future__ import annotations

from collections.abc import Callable

from mtpimage import settings

DEFAULT_ATTEMPTS = 3
DEFAULT_WAIT_MAX = 8.0
DEFAULT_HTTP_TIMEOUT = 20.0
DEFAULT_GIT_TIMEOUT = 300.0
WAIT_MULTIPLIER = 0.5


def attempts() -> int:
    return max(1, int(settings.current().get("MTP_NET_RETRIES") or DEFAULT_ATTEMPTS))


def wait_max() -> float:
    return settings.current().number("MTP_NET_BACKOFF_MAX", DEFAULT_WAIT_MAX)


def http_timeout() -> float:
    return settings.current().number("MTP_HTTP_TIMEOUT", DEFAULT_HTTP_TIMEOUT)


def git_timeout() -> float:
    return settings.current().number("MTP_GIT_TIMEOUT", DEFAULT_GIT_TIMEOUT)


def retrying(transient: Callable[[BaseException], bool], before_sleep=None):
    """A tenacity Retrying under this policy: up to attempts() calls, exponential waits capped
    at wait_max(), retrying only exceptions `transient` accepts; the last error is re-raised
    as it is (never tenacity's RetryError). Call it with the function: `retrying(t)(fn)`."""
    # lazy: tenacity costs import time on runs that touch no network (a no-op build)
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    return Retrying(
        stop=stop_after_attempt(attempts()),
        wait=wait_exponential(multiplier=WAIT_MULTIPLIER, max=wait_max()),
        retry=retry_if_exception(transient),
        before_sleep=before_sleep,
        reraise=True,
    )
