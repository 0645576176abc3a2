"""rsplan: exact memory planning and profiling for the recurrent-state caches of LLMs.

The repository's top-level folders are this package's subpackages:
``rsplan.hparams`` (what a model is), ``rsplan.planner`` (byte arithmetic),
``rsplan.profiler`` (runtime), ``rsplan.kernels`` (state kernels) and ``rsplan.presets`` (YAML data).
"""

__version__ = "0.1.0"

#: The llama.cpp commit whose allocation rules rsplan reproduces (vendored by llama-cpp-python 0.3.36).
LLAMA_CPP_COMMIT = "0c1e57098"
