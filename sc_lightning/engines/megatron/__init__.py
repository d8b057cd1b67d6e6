"""The Megatron generation engine and its internals: KV-cache sampling from the policy's own megatron-core model.

:mod:`~sc_lightning.engines.megatron.engine` is the engine (the event-loop side, in the caller's process) and
:mod:`~sc_lightning.engines.megatron.ray_engine` its client in a Ray actor; the rest serve them alone: the worker
thread (``worker``), the continuous batch (``batch``), the model's forward over a slot KV cache (``cached_forward``,
``kv_cache``, ``decode_kernels``), decode-step CUDA graphs (``cuda_graphs``), batched sampling (``decode_sampling``)
and the clock of the engine's awake time (``clock``).
"""
