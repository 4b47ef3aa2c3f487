"""torchrun as rankscope starts it: ``python -m rankscope.torchrun ARGS`` is ``torchrun ARGS``
(the same ``torch.distributed.run.main``, the same options and behaviour), with torch imported
settled (:mod:`rankscope._settle`): the agent's start and exit cost about 0.6 s less CPU time, on
a machine whose cores the ranks share with it; and, where the ranks' environment allows it, its
ranks forked from a template that imported torch once (:mod:`rankscope._template`)."""

import sys

from rankscope import _template
from rankscope._settle import import_settled

if __name__ == "__main__":
    _template.prepare(sys.argv[1:])  # before torch's import sizes its thread pools
    run = import_settled("torch.distributed.run")
    rank = _template.start()
    if rank is None:
        run.main()
    else:
        _template.run_rank(rank)
