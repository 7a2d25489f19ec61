"""The models a run trains, cut into stage modules, and their data: the interface
(:mod:`~runtime.workloads.base`), the built-ins (:mod:`~runtime.workloads.builtin`: gpt, multimodal,
emulated), a user's factory (:mod:`~runtime.workloads.user`), the TP-sharded layers
(:mod:`~runtime.workloads.tp_layers`), and the one place that picks one (:mod:`~runtime.workloads.make`,
with the single-process reference)."""
