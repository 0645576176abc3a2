"""The capacity searches: the budget flags turned into planners (``budget``), the placement used when none is
given (``fit_placement``, fit's), the searches for the largest -np / -c / n_rs_seq (``search``), what each setting
is charged besides its caches (``charges``) and the report's sizings in forked workers (``pool``)."""
