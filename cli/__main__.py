"""``python -m cli``: see :mod:`cli.main`."""

from cli.main import main

raise SystemExit(main())
