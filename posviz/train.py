"""Command line: ``python -m posviz.train`` (see ``posviz.training.command_line``)."""
from posviz.training.command_line import main

if __name__ == "__main__":
    main()
