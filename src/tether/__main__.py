"""`python -m tether`: the same command line as the `tether` console script (tether.cli)."""

from tether.cli import main

main()
