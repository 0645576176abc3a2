"""``python -m rsplan``: the same as the ``rsplan`` console script."""

from rsplan.cli import main

if __name__ == "__main__":
    main()
