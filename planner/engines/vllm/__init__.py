"""``--engine vllm``: vLLM 0.33.0's memory rules (rules), its answers for estimate / capacity / report (answers) and
its command-line flags as data (flags). Importing this package imports nothing else: the CLI reads flags alone."""
