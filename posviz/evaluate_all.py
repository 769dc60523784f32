"""Command line: ``python -m posviz.evaluate_all`` (see ``posviz.training.evaluate_all``)."""
from posviz.training.evaluate_all import main

if __name__ == "__main__":
    main()
