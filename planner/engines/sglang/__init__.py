"""``--engine sglang``: SGLang 0.5.23's memory rules (rules), its answers for estimate / capacity / report (answers)
and its command-line flags as data (flags). Importing this package imports nothing else: the CLI reads flags alone."""
