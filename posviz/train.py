"""Command line: ``python -m posviz.train`` (see ``posviz.training.train``)."""
from posviz.training.train import main

if __name__ == "__main__":
    main()
