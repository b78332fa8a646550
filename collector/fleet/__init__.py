"""Internal: a fleet of sidecars over one shared store: what goes where (``placement``), the coarse
series and the outbox that carry a node's share to the shared store (``coarse``, ``outbox``,
``forwarder``), the crash signature that groups one fault across GPUs and hosts
(``signature``), and the fleet's reads (``queries``)."""
