"""`python -m faprof` runs the CLI (how faprof runs from a source tree on a GPU machine)."""

from faprof.cli import main

if __name__ == "__main__":
    main()
