"""`python -m faprof.cli`: the same command line as `faprof` (and `python -m faprof`)."""

from faprof.cli import main

if __name__ == "__main__":
    main()
