"""All communication between ranks, under one ordering rule ([Note: transport ordering rule] in
:mod:`runtime.comm.transport`). In import order: :mod:`~runtime.comm.errors`, the wire format
(:mod:`~runtime.comm.frames`), the inbox (:mod:`~runtime.comm.inbox`), links and senders
(:mod:`~runtime.comm.links`), the gloo socket reader (:mod:`~runtime.comm.sockets`), the NCCL receiver
(:mod:`~runtime.comm.nccl`), link set-up (:mod:`~runtime.comm.bootstrap`), the :class:`Transport` facade
(:mod:`~runtime.comm.transport`); beside them the clock (:mod:`~runtime.comm.clock`) and the process grid
(:mod:`~runtime.comm.grid`: what "rank" means with TP and DP, and the groups)."""
