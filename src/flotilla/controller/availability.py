"""Whether the controller's database answers: the `DatabaseAvailable` condition and the API's 503.

While the database cannot be reached (`db.is_outage`) the API answers 503 with `Retry-After` instead of a 500,
so that clients and agents can tell an outage from a bug and retry; `GET /v1/cluster` carries the condition.
One log line when an outage starts and one when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from flotilla.controller.views import iso

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
CONDITION = "DatabaseAvailable"


class DatabaseAvailability:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.available = True
        self.since = clock()
        self.message = "the database answers"

    def outage(self, e: BaseException) -> None:
        with self._lock:
            if not self.available:
                return
            self.available, self.since = False, self.clock()
            detail = (str(getattr(e, "orig", None) or e).strip().splitlines() or [""])[0][:300]
            self.message = f"the database does not answer ({type(e).__name__}: {detail}); requests get 503"
        log.warning("database unreachable: %s", self.message)

    def answered(self) -> None:
        with self._lock:
            if self.available:
                return
            down_s = self.clock() - self.since
            self.available, self.since = True, self.clock()
            self.message = f"the database answers again (it did not for {down_s:.0f} s)"
        log.info("database: %s", self.message)

    def condition(self) -> dict[str, str | None]:
        with self._lock:
            return {"type": CONDITION, "status": "True" if self.available else "False",
                    "reason": "Answering" if self.available else "Unreachable", "message": self.message,
                    "lastTransitionTime": iso(self.since)}
