"""Command line: ``python -m posviz.evaluate`` (see ``posviz.training.evaluate``)."""
from posviz.training.evaluate import main

if __name__ == "__main__":
    main()
