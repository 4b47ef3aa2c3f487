"""torchrun as rankscope starts it: ``python -m rankscope.torchrun ARGS`` is ``torchrun ARGS``
(the same ``torch.distributed.run.main``, the same options and behaviour), with torch imported
settled (:mod:`rankscope._settle`): the agent's start and exit cost about 0.6 s less CPU time, on
a machine whose cores the ranks share with it."""

from rankscope._settle import import_settled

if __name__ == "__main__":
    import_settled("torch.distributed.run").main()
