"""`python -m tracker` is the `tracker` console script."""

from tracker.cli import main

raise SystemExit(main())
