"""`python -m compactlog`: the same as the `compactlog` command."""

from compactlog.cli import main

if __name__ == "__main__":
    main()
