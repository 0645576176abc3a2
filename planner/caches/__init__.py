"""The per-context memory llama.cpp allocates besides weights and compute: how -c / -np / -fa and the cache
types resolve (``context``, ``context_limit``), every KV and recurrent-state tensor (``plan``), the output
buffer and llama-server's checkpoints (``outputs``), draft setups (``speculative``) and the lines llama.cpp
prints for them (``logs``)."""
