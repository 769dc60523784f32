"""Command line: ``python -m posviz.export`` (see ``posviz.models.export``)."""
from posviz.models.export import main

if __name__ == "__main__":
    main()
