"""The capacity searches: the budget flags parsed (``request``), a serving engine's budget from them (``serving``),
the llama.cpp planners made from them (``budget``), what a search is given and raises (``limits``) and answers
(``answers``), the placement used when none is given (``fit_placement``, fit's), the memory of one setting on each
device and the host (``setting_memory``), what each setting is charged besides its caches (``charges``), the
searches for the largest -np / -c / n_rs_seq (``search``), the llama.cpp flags that run an answer
(``llama_flags``) and the report's sizings in forked workers (``pool``)."""
