"""A sample budget as a training library might keep it: each rank counts the samples it has
seen, and the rank that spends its budget ends its process at once (as some libraries' workers
do), without telling the others."""

import os
import sys


class SampleBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = 0

    def spend(self, n: int) -> None:
        self.seen += n
        if self.seen >= self.limit:  # site: budget_decide
            print(f"sample budget of {self.limit} spent, exiting", file=sys.stderr, flush=True)
            os._exit(0)  # site: budget_exit
